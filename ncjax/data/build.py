"""Build a dataset from files you already have (ArrayRecord via tfds; TensorFlow is not needed).

  python -m ncjax.data.build --dataset=karpathy/flickr30k --manual_dir=/data/flickr30k --data_dir=/data/tfds
  python -m ncjax.data.build --dataset=web_pairs/cc3m --manual_dir=/data/cc3m_wds --data_dir=/data/tfds
  python -m ncjax.data.build --dataset=web_pairs/custom_table --manual_dir=/data/mypairs --data_dir=/data/tfds \\
      --table=pairs.csv --separator=, --image_column=path --caption_column=caption \\
      [--label_column=label --class_names=names.txt] [--clean_column=clean] [--holdout=0.1 | --split_column=split]
  python -m ncjax.data.build --dataset=precomp/f30k_precomp --manual_dir=/data/f30k_precomp --data_dir=/data/tfds

Then train with --config.input.dataset=tfds:karpathy/flickr30k --config.input.data_dir=/data/tfds.
"""

from __future__ import annotations

import argparse
import sys

from ncjax.data import readers, tfds_builders


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--dataset", required=True, help="<builder>/<config>: " + ", ".join(
      f"{n}/{{{','.join(c.name for c in getattr(b, 'BUILDER_CONFIGS', []) or [])}}}" if getattr(
          b, "BUILDER_CONFIGS", None) else n for n, b in tfds_builders.BUILDERS.items()))
  p.add_argument("--manual_dir", default=None, help="your files")
  p.add_argument("--data_dir", required=True, help="where the built dataset goes")
  p.add_argument("--table", default=None, help="custom_table: CSV/TSV file name inside manual_dir")
  p.add_argument("--separator", default=None, help="custom_table: column separator (default tab)")
  p.add_argument("--image_column", default=None)
  p.add_argument("--caption_column", default=None)
  p.add_argument("--label_column", default=None,
                 help="a class label per row (table column, or WebDataset .json key): an integer or a name")
  p.add_argument("--class_names", default=None,
                 help="custom_table: a file with one class name per line (label i = line i); default: the sorted "
                      "distinct labels")
  p.add_argument("--clean_column", default=None,
                 help="a ground-truth clean flag per row (table column or .json key; 1/0), for noise-detection "
                      "diagnostics only")
  p.add_argument("--holdout", type=float, default=None,
                 help="put this fraction of the images (with all their rows) in a 'test' split")
  p.add_argument("--split_column", default=None, help="custom_table: an explicit split name per row")
  args = p.parse_args(argv)
  name, _, config = args.dataset.partition("/")
  class_names = None
  if args.class_names:
    with open(args.class_names, encoding="utf-8") as f:
      class_names = tuple(line.strip() for line in f if line.strip())
  columns = dict(table=args.table, separator=args.separator, image_column=args.image_column,
                 caption_column=args.caption_column, label_column=args.label_column, clean_column=args.clean_column,
                 class_names=class_names, holdout=args.holdout, split_column=args.split_column)
  try:
    if name == "web_pairs" and any(v is not None for v in columns.values()):
      builder = tfds_builders.build_table(config or None, args.manual_dir, args.data_dir, **columns)
    else:
      builder = tfds_builders.build(name, config or None, args.manual_dir, args.data_dir)
  except readers.DataFormatError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  for split, info in builder.info.splits.items():
    print(f"{builder.name}/{builder.builder_config.name if builder.builder_config else ''} {split}: "
          f"{info.num_examples} records")
  print(f"built under {builder.data_dir}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
