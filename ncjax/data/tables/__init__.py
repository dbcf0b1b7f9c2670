"""Datasets built from the user's files into ArrayRecord through tfds, and read back (`tfds:NAME/CONFIG`), and the
evaluation datasets read as they are (image folders, CLIP_benchmark's names).

  builders        the tfds builders (Karpathy splits, web_pairs tables and WebDataset shards, precomp features,
                  digits) and `build` / `build_table` (`python -m ncjax.data.build`)
  sources         a built split as a `PairSplit` (records read on demand), image sources for evaluation
  readers         readers of the on-disk formats users have (WebDataset tars, CSV / TSV tables, Karpathy JSON,
                  NCR's precomp features), each failing with a message naming what was expected
  classification  classification datasets for zero-shot and linear probes (image folders, tfds, CLIP_benchmark's
                  class names and templates in metadata/)
"""
