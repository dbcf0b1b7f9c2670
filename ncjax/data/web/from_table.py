"""A CSV / TSV table of (image path, caption) — open_clip's `--csv-img-key filepath --csv-caption-key title` data —
written as img2dataset's webdataset layout, so that a table of any size trains through the web reader with host
memory that does not grow with it (ncjax.data.web.pipeline).

Why: the table builder (`--dataset=web_pairs/custom_table`, tfds) keeps every caption and several per-pair arrays in
each training process — about 230 bytes per pair, 2.8 GB per process at 12M pairs (docs/notes/web_data_cpu.md). Up
to about a million pairs that is the simpler path (evaluation of the training pairs, noise files); beyond it, this.

  python -m ncjax.data.build --dataset=web --manual_dir=/data/mypairs --table=pairs.tsv --output_dir=/data/mypairs_wds
  ncjax train --config=clip:data=web:/data/mypairs_wds ...

Rows are read as a stream (the table is never held whole), `per_shard` successful rows per tar: `KEY.EXT` (the
image file's bytes as they are, no re-encoding), `KEY.txt` (the caption), `KEY.json` (key, caption, the image path
as `url`, the clean column when given); `SHARD.parquet` with one row per table row (status 'success', or
'failed_to_download' with the reason when the image file is missing or unreadable: those rows are not in the tar,
as img2dataset skips failed downloads) and `SHARD_stats.json`. The index is then built. A pair's example id is its
rank among the rows whose image was found, in the table's order.
"""

from __future__ import annotations

import csv
import json
import logging
import os

from ncjax import fileio
from ncjax.data.tables import readers
from ncjax.data.web import tar as web_tar

log = logging.getLogger("ncjax")

_EXTENSIONS = {"jpg": "jpg", "jpeg": "jpg", "png": "png", "webp": "webp", "bmp": "bmp"}


def _write_shard(out_root: str, shard: int, members: list[bytes], rows: dict, successes: int) -> None:
  stem = fileio.join(out_root, f"{shard:05d}")
  fileio.write_bytes(stem + ".tar", b"".join(members) + web_tar.tar_end())
  web_tar.write_parquet(stem + ".parquet", rows)
  fileio.write_text(stem + "_stats.json", json.dumps(dict(
      count=len(rows["key"]), successes=successes, failed_to_download=len(rows["key"]) - successes)))


def table_to_webdataset(table: str, out_root: str, *, image_column: str = "filepath", caption_column: str = "title",
                        separator: str = "\t", clean_column: str = "", images_root: str | None = None,
                        per_shard: int = 10_000, progress=None) -> dict:
  """Write the table's pairs as webdataset shards under `out_root` (local or gs://). Returns {pairs, failed,
  shards}."""
  if not os.path.isfile(table):
    raise readers.DataFormatError(f"caption table {table} not found; {readers._listing(os.path.dirname(table) or '.')}")
  root = images_root or os.path.dirname(os.path.abspath(table))
  fileio.makedirs(out_root)
  shard, pairs, failed = 0, 0, 0
  members: list[bytes] = []
  rows = _empty_rows(clean_column)
  in_shard = 0
  with open(table, newline="", encoding="utf-8") as f:
    reader = csv.DictReader(f, delimiter=separator)
    columns = reader.fieldnames or []
    missing = [c for c in (image_column, caption_column, *([clean_column] if clean_column else [])) if c not in columns]
    if missing:
      raise readers.DataFormatError(f"{table}: missing column(s) {missing}; the header (split on {separator!r}) has "
                                    f"{columns}: pass --image_column / --caption_column / --separator")
    for line, row in enumerate(reader):
      path = row[image_column]
      path = path if os.path.isabs(path) else os.path.join(root, path)
      key = f"{shard:05d}{len(rows['key']):05d}"
      caption = row[caption_column] or ""
      rows["key"].append(key)
      rows["caption"].append(caption)
      rows["url"].append(path)
      if clean_column:
        rows["clean"].append(row[clean_column])
      try:
        with open(path, "rb") as img:
          data = img.read()
      except OSError as e:
        rows["status"].append("failed_to_download")
        rows["error_message"].append(f"{type(e).__name__}: {e.strerror or e}")
        failed += 1
        continue
      rows["status"].append("success")
      rows["error_message"].append(None)
      ext = _EXTENSIONS.get(os.path.splitext(path)[1].lstrip(".").lower(), "jpg")
      meta = dict(key=key, caption=caption, url=path, status="success", table_row=line)
      if clean_column:
        meta["clean"] = row[clean_column]
      members += [web_tar.tar_member(f"{key}.{ext}", data), web_tar.tar_member(f"{key}.txt", caption.encode()),
                  web_tar.tar_member(f"{key}.json", json.dumps(meta).encode())]
      pairs += 1
      in_shard += 1
      if in_shard == per_shard:
        _write_shard(out_root, shard, members, rows, in_shard)
        shard, in_shard, members, rows = shard + 1, 0, [], _empty_rows(clean_column)
        if progress:
          progress(pairs)
  if rows["key"]:
    _write_shard(out_root, shard, members, rows, in_shard)
    shard += 1
  if failed:
    log.warning("%d rows of %s have no readable image: recorded as failed rows (status 'failed_to_download') in "
                "the shards' parquet files, not trained on", failed, table)
  return dict(pairs=pairs, failed=failed, shards=shard)


def _empty_rows(clean_column: str) -> dict:
  rows = dict(key=[], caption=[], url=[], status=[], error_message=[])
  if clean_column:
    rows["clean"] = []
  return rows
