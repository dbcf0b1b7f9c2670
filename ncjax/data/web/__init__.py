"""Web-scale data: img2dataset's output (WebDataset tar shards, parquet, _stats.json) read where it lies — local disk
or an object store — at any size, with host memory that does not grow with it.

  dataset     a dataset's shards, counts and ids (`WebDataset`, `open_dataset`), streamed or indexed reads
  tar         tar members and samples parsed from any file object; the layout's writer
  index       the index (`python -m ncjax.data.build --dataset=web`): byte offsets, keyed by shard name and version
  store       reading files where they lie: concurrent ranged reads and the fault policy
  mixture     the order: mixtures, per-epoch permutations, block order, streamed shard schedules
  permutation on-demand permutations (Feistel, with an exact inverse)
  pipeline    the training input (`WebTrainData`): units of reads, examples, resume checks
  stages      the fetch / decode / consumer stages
  decode      per-example decode, crop, normalise, tokenise on threads or worker processes
  from_table  a CSV / TSV of (image path, caption) written as webdataset shards
  synthetic   synthetic img2dataset output (tests, benchmarks)
"""
