"""Build a dataset from files you already have (ArrayRecord via tfds; TensorFlow is not needed).

  python -m ncjax.data.build --dataset=karpathy/flickr30k --manual_dir=/data/flickr30k --data_dir=/data/tfds
  python -m ncjax.data.build --dataset=web_pairs/cc3m --manual_dir=/data/cc3m_wds --data_dir=/data/tfds
  python -m ncjax.data.build --dataset=web_pairs/custom_table --manual_dir=/data/mypairs --data_dir=/data/tfds \\
      --table=pairs.csv --separator=, --image_column=path --caption_column=caption \\
      [--label_column=label --class_names=names.txt] [--clean_column=clean] [--holdout=0.1 | --split_column=split]
  python -m ncjax.data.build --dataset=precomp/f30k_precomp --manual_dir=/data/f30k_precomp --data_dir=/data/tfds

Then train with --config.input.dataset=tfds:karpathy/flickr30k --config.input.data_dir=/data/tfds.

img2dataset output at any size is indexed where it lies (ncjax.data.web.dataset: ROOT/_ncjax_index/, 4 bytes per pair;
each shard read once, in parallel over the cores, and over hosts with --num_hosts/--host_index, then --merge once):
  python -m ncjax.data.build --dataset=web --manual_dir=/data/laion400m [--workers=N] [--clean_column=clean]
      [--num_hosts=H --host_index=h] [--merge] [--index_dir=DIR]
and trained with --config=configs/clip.py:data=web:/data/laion400m (ncjax.data.web.pipeline).

A table too large for the table builder (a training process holds ~230 bytes per pair of a built table; millions
of pairs: ncjax.data.web.from_table) is written as webdataset shards and indexed, then trained as web data:
  python -m ncjax.data.build --dataset=web --manual_dir=/data/mypairs --table=pairs.tsv [--output_dir=DIR]
      [--image_column=filepath --caption_column=title --separator=TAB --clean_column=clean --per_shard=10000]
"""

from __future__ import annotations

import argparse
import os
import sys

from ncjax import fileio
from ncjax.data.tables import readers
from ncjax.data.tables import builders as tfds_builders


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--dataset", required=True, help="<builder>/<config>: " + ", ".join(
      f"{n}/{{{','.join(c.name for c in getattr(b, 'BUILDER_CONFIGS', []) or [])}}}" if getattr(
          b, "BUILDER_CONFIGS", None) else n for n, b in tfds_builders.BUILDERS.items()))
  p.add_argument("--manual_dir", default=None, help="your files")
  p.add_argument("--data_dir", default=None, help="where the built dataset goes (not for --dataset=web)")
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
  p.add_argument("--workers", type=int, default=0, help="web: scanning processes (0: one per usable core)")
  p.add_argument("--num_hosts", type=int, default=1, help="web: hosts sharing the build (shards h::num_hosts)")
  p.add_argument("--host_index", type=int, default=0, help="web: this host's index among --num_hosts")
  p.add_argument("--merge", action="store_true", help="web: join every host's parts into the index (once, at the "
                 "end; implied with one host)")
  p.add_argument("--index_dir", default="", help="web: where the index goes (default MANUAL_DIR/_ncjax_index)")
  p.add_argument("--output_dir", default="", help="web with --table: where the table's pairs are written as "
                 "webdataset shards (default MANUAL_DIR/_ncjax_web), then indexed")
  p.add_argument("--per_shard", type=int, default=10_000, help="web with --table: pairs per tar shard")
  p.add_argument("--io_deadline_s", type=float, default=300.0, help="web: how long a read retries a store that does "
                 "not answer before the build stops (relaunch it: scanned shards are kept)")
  p.add_argument("--request_timeout_s", type=float, default=60.0, help="web: one request to the store, at most")
  args = p.parse_args(argv)
  if args.dataset == "web":
    return build_web(args)
  if not args.data_dir:
    p.error("--data_dir is required (where the built dataset goes)")
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


def build_web(args) -> int:
  import time
  from ncjax.data.web import index as web_index
  if not args.manual_dir:
    print("error: --dataset=web needs --manual_dir=ROOT (img2dataset's output)", file=sys.stderr)
    return 2
  t0 = time.perf_counter()
  fileio.bound_requests(args.request_timeout_s)
  try:
    if args.table:   # a CSV/TSV of (image path, caption) -> webdataset shards, then their index
      from ncjax.data.web import from_table as web_from_table
      table = args.table if os.path.isabs(args.table) else os.path.join(args.manual_dir, args.table)
      args.manual_dir = args.output_dir or os.path.join(args.manual_dir, "_ncjax_web")
      written = web_from_table.table_to_webdataset(
          table, args.manual_dir, image_column=args.image_column or "filepath",
          caption_column=args.caption_column or "title", separator=args.separator or "\t",
          clean_column=args.clean_column or "", per_shard=args.per_shard,
          progress=lambda n: print(f"\r{n} pairs written", end="", file=sys.stderr, flush=True))
      print(f"\n{table}: {written['pairs']} pairs in {written['shards']} shards under {args.manual_dir} "
            f"({written['failed']} rows without a readable image); indexing", file=sys.stderr)
      args.clean_column = "clean" if args.clean_column else ""
    if args.merge and args.num_hosts > 1:
      manifest = web_index.merge_index(args.manual_dir, args.index_dir, clean_key=args.clean_column or "",
                                       deadline_s=args.io_deadline_s)
    else:
      manifest = web_index.build_index(args.manual_dir, index_dir=args.index_dir, workers=args.workers,
                                 num_hosts=args.num_hosts, host_index=args.host_index,
                                 clean_key=args.clean_column or "", merge=True if args.merge else None,
                                 deadline_s=args.io_deadline_s, request_timeout_s=args.request_timeout_s,
                                 progress=lambda done, total: print(f"\r{done}/{total} shards", end="",
                                                                    file=sys.stderr, flush=True))
  except (readers.DataFormatError, fileio.StorageError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  dt = time.perf_counter() - t0
  print(file=sys.stderr)
  if manifest is None:
    print(f"host {args.host_index} of {args.num_hosts}: its shards are indexed ({dt:.1f} s); run --merge once "
          f"every host is done")
    return 0
  print(f"web index of {args.manual_dir}: {manifest['num_examples']} pairs in {len(manifest['shards'])} shards, "
        f"{len(manifest['bad_shards'])} damaged ({dt:.1f} s); train with --config=...:data=web:{args.manual_dir}")
  for shard, why in list(manifest["bad_shards"].items())[:10]:
    print(f"  {shard}: {why}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
