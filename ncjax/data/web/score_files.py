"""Per-shard score files of a web dataset: what `ncjax audit` writes for every pair of img2dataset output, what `ncjax
filter` and the audit's report read back — each a scan with memory bounded by a shard, whatever the dataset's size.

Layout under the audit's output directory OUT (local or gs://):

  OUT/scores/manifest.json           the scorer (model, checkpoint, score kind) and every dataset's identity (root,
                                     shard names, sample counts, sizes, the first global id of each dataset)
  OUT/scores/d<d>/<shard>.parquet    dataset d's shard <shard> (its path relative to the root, .tar -> .parquet)

A shard's file holds one row per pair of the shard, in id order: `id` (int64: the pair's example id under the scored
`web:` spec, the id training uses — a mixture's datasets follow one another), `key` (its key in the tar), `score`
(float32, higher = cleaner; NaN for a bad record), `bad` (why a record could not be scored, '' otherwise: a sample
missing from a cut tar, an image that does not decode, an empty or non-UTF-8 caption — the records training skips
and counts), `offset` and `length` (the sample's bytes in its tar, -1 when unknown: one ranged read fetches it
again), `clean` (int8: the data's own clean flag where a clean key is known, else -1). The file's schema metadata
repeats the shard's name, size and count and the scorer's digest.

A file is written whole (atomically) once every pair of its shard is scored, so a file that exists is complete: a
resumed audit lists OUT/scores once and skips those shards; a shard being scored when the audit was killed has no
file and is scored again.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import io
import json

import numpy as np

from ncjax import errors, fileio

FORMAT = "ncjax-web-scores"
VERSION = 1
DIRNAME = "scores"
COLUMNS = ("id", "key", "score", "bad", "offset", "length", "clean")


def scores_dir(out: str) -> str:
  return fileio.join(out, DIRNAME)


def shard_file(out: str, dataset: int, shard_name: str) -> str:
  stem = shard_name[:-len(".tar")] if shard_name.endswith(".tar") else shard_name
  return fileio.join(scores_dir(out), f"d{dataset}", f"{stem}.parquet")


def scorer_digest(scorer: dict) -> str:
  return hashlib.sha256(json.dumps(scorer, sort_keys=True).encode()).hexdigest()[:16]


def make_manifest(identities: list[dict], offsets, scorer: dict) -> dict:
  datasets = [dict(ident, offset=int(off)) for ident, off in zip(identities, offsets)]
  return dict(format=FORMAT, version=VERSION, scorer=scorer, scorer_digest=scorer_digest(scorer),
              datasets=datasets, num_examples=int(sum(d["num_examples"] for d in datasets)))


def read_manifest(out: str) -> dict | None:
  try:
    manifest = json.loads(fileio.read_text(fileio.join(scores_dir(out), "manifest.json")))
  except FileNotFoundError:
    return None
  if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
    raise errors.DataError(f"{scores_dir(out)}/manifest.json is not an ncjax score manifest of version {VERSION}")
  return manifest


def require_manifest(out: str) -> dict:
  manifest = read_manifest(out)
  if manifest is None:
    raise errors.DataError(f"{scores_dir(out)} holds no manifest.json: score the dataset first (ncjax audit "
                           f"--dataset=web:ROOT --output={out} ...)")
  return manifest


def same_work(a: dict, b: dict) -> str:
  """'' when two manifests describe the same scoring (scorer and data), else what differs."""
  if a["scorer_digest"] != b["scorer_digest"]:
    return f"another scorer ({a['scorer']} vs {b['scorer']})"
  for x, y in zip(a["datasets"], b["datasets"]):
    for key in ("root", "shards", "counts", "sizes", "offset", "versions"):
      if (key in x or key in y) and key != "versions" and x[key] != y[key] or \
          key == "versions" and key in x and key in y and x[key] != y[key]:   # (written before versions existed)
        return f"other data ({key} of {x['name']} differ)"
  if len(a["datasets"]) != len(b["datasets"]):
    return "another number of datasets"
  return ""


def shards_of(manifest: dict) -> list[tuple[int, int, str, int, int]]:
  """(dataset, shard index, shard name, first global id, count) of every shard, in id order."""
  out = []
  for d, ds in enumerate(manifest["datasets"]):
    first = ds["offset"]
    for s, (name, n) in enumerate(zip(ds["shards"], ds["counts"])):
      out.append((d, s, name, first, int(n)))
      first += int(n)
  return out


# ---------------------------------------------------------------------------------------------------------------
# one shard's file
# ---------------------------------------------------------------------------------------------------------------
def encode(rows: dict, meta: dict) -> bytes:
  """A shard's rows (numpy arrays / lists of COLUMNS) as parquet bytes, with `meta` in the schema metadata."""
  import pyarrow as pa
  import pyarrow.parquet as pq
  table = pa.table({
      "id": pa.array(np.asarray(rows["id"], np.int64)),
      "key": pa.array([str(k) for k in rows["key"]], pa.string()),
      "score": pa.array(np.asarray(rows["score"], np.float32)),
      "bad": pa.array([str(b) for b in rows["bad"]], pa.string()),
      "offset": pa.array(np.asarray(rows["offset"], np.int64)),
      "length": pa.array(np.asarray(rows["length"], np.int64)),
      "clean": pa.array(np.asarray(rows["clean"], np.int8)),
  }).replace_schema_metadata({"ncjax": json.dumps(meta)})
  buf = io.BytesIO()
  pq.write_table(table, buf, compression="zstd")
  return buf.getvalue()


def decode(data: bytes, columns=None) -> dict:
  """{column: numpy array (strings: a list)} of a shard file's bytes."""
  import pyarrow.parquet as pq
  table = pq.read_table(io.BytesIO(data), columns=list(columns) if columns else None)
  out = {}
  for name in table.column_names:
    col = table.column(name)
    out[name] = col.to_pylist() if name in ("key", "bad") else col.to_numpy()
  return out


def write_shard(path: str, rows: dict, meta: dict) -> None:
  fileio.write_bytes(path, encode(rows, meta))


def finished(out: str, manifest: dict) -> set[tuple[int, int]]:
  """(dataset, shard) of every shard whose file exists (one recursive listing of OUT/scores)."""
  from ncjax.data.web import store
  root = scores_dir(out)
  if not fileio.exists(root):
    return set()
  present = {o.path for o in store.list_files(root, ".parquet")}
  return {(d, s) for d, s, name, _, _ in shards_of(manifest) if shard_file(out, d, name) in present}


def missing(out: str, manifest: dict) -> list[str]:
  done = finished(out, manifest)
  return [f"d{d}/{name}" for d, s, name, _, _ in shards_of(manifest) if (d, s) not in done]


def scan(out: str, manifest: dict, columns, workers: int = 16, window: int = 64):
  """(dataset, shard, first id, count, {column: array}) of every shard's file in id order, `window` files read
  concurrently at a time (memory: `window` shards' columns). A file whose row count or ids disagree with the
  manifest is one error naming it."""
  from ncjax.data.web import store
  policy = store.RetryPolicy()
  work = shards_of(manifest)
  wanted = list(dict.fromkeys(["id", *columns]))

  def read(item):
    d, _, name, _, _ = item
    path = shard_file(out, d, name)
    try:
      return decode(policy.call(lambda: fileio.read_bytes(path), path), wanted)
    except store.ShardMissing:
      raise errors.DataError(f"{path} is missing: the scores are not complete (resume the audit with the same "
                             f"command to score the rest)") from None

  with cf.ThreadPoolExecutor(min(workers, max(1, len(work)))) as pool:
    for a in range(0, len(work), window):
      chunk = work[a:a + window]
      for (d, s, name, first, n), cols in zip(chunk, pool.map(read, chunk)):
        ids = cols["id"]
        if len(ids) != n or (n and (ids[0] != first or ids[-1] != first + n - 1)):
          raise errors.DataError(f"{shard_file(out, d, name)} holds {len(ids)} rows (ids {ids[:1]}...), its shard "
                                 f"{n} pairs from id {first}: the file belongs to other data; delete it and resume")
        yield d, s, first, n, cols
