"""Training on a subset of a web dataset without rewriting it: a kept set per dataset, one bit per pair, with the
rank and select a training order needs, checked against the data it was chosen from.

A filter directory (written by `ncjax filter` from per-shard score files, ncjax.data.web.score_files) holds:
* `manifest.json`: the rule (keep a fraction, or a score threshold; over all pairs or per dataset of a mixture),
  the thresholds it came to, and for every dataset its root, shard names, sample counts and sizes (what the data
  must still be), its pair count and kept count, and its bit file;
* `kept-<d>-<digest>.npy`: dataset d's kept flags, bit i of byte i // 8 (little-endian bit order) for the pair of
  local id i, padded with zeros to whole superblocks of 4,096 bits (content-addressed: the digest names the bits).

Ids stay the unfiltered dataset's (`starts[s] + j`, ncjax.data.web.dataset): scores, audits and per-sample state keep
their meaning, and a kept pair is trained under the id it had. A filtered run's order is an order over the kept
pairs — its rank r in 0..K-1 (the r-th kept id, in id order) goes through the same on-demand permutations as an
unfiltered run's (ncjax.data.web.mixture) and back to its id by `select` — so it is a pure function of (seed, step)
and the filter, and a resume restores nothing but the step.

Memory. The bits are 1 bit per pair (400M pairs: 50 MB per dataset) in a file memory-mapped from a per-host cache
(a gs:// filter is downloaded once per host, like the index), so a host's processes share one copy in the page
cache; each process adds the kept count before every superblock (8 bytes per 4,096 pairs: 0.8 MB at 400M). rank and
select are vectorised over a step's ids: a superblock look-up, then byte popcounts within its 512 bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os

import numpy as np

from ncjax import errors, fileio

FORMAT = "ncjax-web-filter"
VERSION = 1
SUPERBLOCK = 4096                  # bits per superblock: the rank directory's granularity
SUPERBLOCK_BYTES = SUPERBLOCK // 8

_POPCOUNT = np.asarray([bin(v).count("1") for v in range(256)], np.uint8)
# _SELECT[v, k]: the position (0-7) of the (k+1)-th set bit of byte v (little-endian bit order), 8 where none
_SELECT = np.full((256, 8), 8, np.int8)
for _v in range(256):
  for _k, _bit in enumerate(b for b in range(8) if _v >> b & 1):
    _SELECT[_v, _k] = _bit


def pack(flags: np.ndarray) -> np.ndarray:
  """Kept flags (bool, one per pair) as the bit file's bytes, padded to whole superblocks."""
  flags = np.asarray(flags, bool)
  packed = np.packbits(flags, bitorder="little")
  pad = (-len(packed)) % SUPERBLOCK_BYTES
  return np.concatenate([packed, np.zeros(pad, np.uint8)]) if pad else packed


class BitWriter:
  """Kept flags appended in id order (shard by shard), packed as they come: memory of one byte's carry, not N."""

  def __init__(self):
    self.chunks: list[np.ndarray] = []
    self.carry = np.zeros(0, bool)

  def add(self, flags) -> None:
    flags = np.concatenate([self.carry, np.asarray(flags, bool)])
    whole = len(flags) // 8 * 8
    if whole:
      self.chunks.append(np.packbits(flags[:whole], bitorder="little"))
    self.carry = flags[whole:]

  def finish(self) -> np.ndarray:
    tail = [np.packbits(self.carry, bitorder="little")] if len(self.carry) else []
    packed = np.concatenate(self.chunks + tail) if self.chunks or tail else np.zeros(0, np.uint8)
    pad = (-len(packed)) % SUPERBLOCK_BYTES
    return np.concatenate([packed, np.zeros(pad, np.uint8)]) if pad else packed


class KeptSet:
  """One dataset's kept pairs: `n` ids, `kept` of them kept; select (rank -> id), rank (id -> kept before it),
  contains. `bits`: the bit file's bytes (a memory map, or an array)."""

  def __init__(self, bits: np.ndarray, n: int):
    self.n = int(n)
    bits = np.asarray(bits, np.uint8) if not isinstance(bits, np.memmap) else bits
    if len(bits) * 8 < self.n or len(bits) % SUPERBLOCK_BYTES:
      raise errors.DataError(f"a kept-pairs bit file of {len(bits)} bytes cannot hold {self.n} pairs in whole "
                             f"superblocks: the filter is damaged; write it again (ncjax filter)")
    self.bits = bits
    self.rows = bits.reshape(-1, SUPERBLOCK_BYTES)
    counts = np.empty(len(self.rows), np.int64)
    step = 1 << 14   # superblocks per pass: 8 MiB of bytes at a time, whatever the dataset's size
    for a in range(0, len(self.rows), step):
      counts[a:a + step] = _POPCOUNT[np.asarray(self.rows[a:a + step])].sum(axis=1, dtype=np.int64)
    self.before = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)   # kept before each superblock
    self.kept = int(self.before[-1])
    if self.n % 8 or len(bits) * 8 > self.n:   # bits past the last pair must be clear (else `kept` is wrong)
      tail = np.unpackbits(np.asarray(bits[self.n // 8:]), bitorder="little")[self.n % 8:]
      if tail.any():
        raise errors.DataError(f"a kept-pairs bit file marks pairs beyond its dataset's {self.n}: the filter is "
                               f"damaged; write it again (ncjax filter)")

  @classmethod
  def from_flags(cls, flags) -> "KeptSet":
    flags = np.asarray(flags, bool)
    return cls(pack(flags), len(flags))

  def contains(self, ids) -> np.ndarray:
    ids = np.asarray(ids, np.int64)
    return (np.asarray(self.bits[ids >> 3]) >> (ids & 7).astype(np.uint8) & 1).astype(bool)

  def rank(self, ids) -> np.ndarray:
    """How many kept ids are below each id (the rank of a kept id)."""
    ids = np.asarray(ids, np.int64)
    sb, within = np.divmod(ids, SUPERBLOCK)
    rows = np.asarray(self.rows[sb])                                  # (q, 512)
    byte, bit = np.divmod(within, 8)
    counts = np.cumsum(_POPCOUNT[rows], axis=1, dtype=np.int32)       # kept up to and including each byte
    full = np.where(byte > 0, counts[np.arange(len(ids)), np.maximum(byte - 1, 0)], 0)
    last = rows[np.arange(len(ids)), byte] & ((1 << bit) - 1).astype(np.uint8)
    return self.before[sb] + full + _POPCOUNT[last]

  def select(self, ranks) -> np.ndarray:
    """The kept id of each rank (0 <= rank < kept), in id order."""
    ranks = np.asarray(ranks, np.int64)
    if ranks.size and (ranks.min() < 0 or ranks.max() >= self.kept):
      raise IndexError(f"kept ranks outside [0, {self.kept}): {ranks[(ranks < 0) | (ranks >= self.kept)][:5]}")
    out = np.empty(ranks.shape, np.int64)
    chunk = 4096   # queries per pass: (chunk, 512) byte counts, 4 MiB
    for a in range(0, ranks.size, chunk):
      r = ranks.reshape(-1)[a:a + chunk]
      sb = np.searchsorted(self.before, r, side="right") - 1
      within = r - self.before[sb]                                    # 0-based rank inside the superblock
      rows = np.asarray(self.rows[sb])
      counts = np.cumsum(_POPCOUNT[rows], axis=1, dtype=np.int32)
      byte = np.argmax(counts > within[:, None], axis=1)              # the byte holding it
      before = np.where(byte > 0, counts[np.arange(len(r)), np.maximum(byte - 1, 0)], 0)
      bit = _SELECT[rows[np.arange(len(r)), byte], within - before]
      out.reshape(-1)[a:a + chunk] = sb * SUPERBLOCK + byte * 8 + bit
    return out

  def count_between(self, starts) -> np.ndarray:
    """Kept pairs in each range [starts[k], starts[k + 1]) of ids (a dataset's shards: per-shard kept counts)."""
    starts = np.asarray(starts, np.int64)
    return np.diff(self.rank_at(starts))

  def rank_at(self, positions) -> np.ndarray:
    """rank() that also takes n (the end of the id space)."""
    positions = np.asarray(positions, np.int64)
    out = np.empty(positions.shape, np.int64)
    end = positions >= self.n
    out[end] = self.kept
    out[~end] = self.rank(positions[~end])
    return out

  def flags(self, first: int, last: int) -> np.ndarray:
    """The kept flags of ids [first, last) (a shard's: bounded by its size)."""
    a, b = first // 8, -(-last // 8)
    bits = np.unpackbits(np.asarray(self.bits[a:b]), bitorder="little")
    return bits[first - a * 8:last - a * 8].astype(bool)


@dataclasses.dataclass
class Subset:
  """The kept sets of a run's datasets (one per dataset of the mixture, in order), as `input.web.filter` names
  them; `digest` identifies the choice (recorded with every checkpoint: a resume with another filter is refused)."""
  path: str
  manifest: dict
  kept: list[KeptSet]

  @property
  def digest(self) -> str:
    return self.manifest["digest"]

  @property
  def kept_sizes(self) -> np.ndarray:
    return np.asarray([k.kept for k in self.kept], np.int64)

  def describe(self) -> str:
    rule = self.manifest["rule"]
    if rule.get("keep") is not None:
      how = f"the best {rule['keep']:.0%}" + (" of each dataset" if rule.get("per_dataset") else "")
    elif rule.get("min_score") is not None:
      how = f"score >= {rule['min_score']:g}"
    else:
      how = "pairs chosen outside ncjax filter"
    parts = ", ".join(f"{d['name']} {k.kept:,} of {k.n:,}" for d, k in zip(self.manifest["datasets"], self.kept))
    return f"filter {self.path} ({how} by {self.manifest.get('scorer', {}).get('kind', 'scores')}): {parts}"


# ---------------------------------------------------------------------------------------------------------------
# writing and opening a filter directory
# ---------------------------------------------------------------------------------------------------------------
def dataset_identity(ds, listing=None) -> dict:
  """What a dataset's filter (or score files) must still match: its root, name, shard names, counts and sizes.
  `listing`: the shards' ObjectInfo (size, version) when the caller has it; else one listing of the root."""
  from ncjax.data.web import index as web_index
  from ncjax.data.web import store
  if listing is None:
    found = {o.path: o for o in store.list_files(ds.root, ".tar", ds.policy)}
    listing = [found.get(p) for p in ds.shards]
  names = [web_index.relative(ds.root, p) for p in ds.shards]
  versions = [(o.version + (f":{o.checksum}" if o.checksum else "")) if o is not None else "" for o in listing]
  return dict(root=fileio.absolute(ds.root), name=ds.name, shards=names, counts=[int(c) for c in ds.counts],
              sizes=[int(o.size) if o is not None else -1 for o in listing], num_examples=int(ds.num_examples),
              versions=versions)


def check_identity(expected: dict, ds, what: str, listing=None) -> None:
  """One error naming the first difference between a recorded dataset identity and the dataset as it is now
  (shard names, sample counts, sizes): a filter or score file applied to other data would keep the wrong pairs."""
  now = dataset_identity(ds, listing)
  if now["shards"] != expected["shards"]:
    theirs, ours = set(expected["shards"]), set(now["shards"])
    diff = sorted(theirs ^ ours)
    example = diff[0] if diff else next(a for a, b in zip(expected["shards"], now["shards"]) if a != b)
    raise errors.DataError(f"{what} was made for {len(expected['shards'])} shards of {expected['root']}, "
                           f"{ds.root} has {len(now['shards'])} (e.g. {example} differs): it belongs to other data; "
                           f"score and filter this dataset again")
  for key, label in (("counts", "pairs"), ("sizes", "bytes")):
    for name, a, b in zip(now["shards"], expected[key], now[key]):
      if a != b and a >= 0 and b >= 0:
        raise errors.DataError(f"{what}: shard {name} of {ds.root} has {b} {label}, the filter's data had {a}: the "
                               f"shard changed since it was scored; score and filter it again")
  # the version (an object's generation and checksum, a local file's modification time): a rewrite of the same
  # size — the same count of other pairs — is not the data that was scored (files written before 2026-11-26 lack it)
  for name, a, b in zip(now["shards"], expected.get("versions") or [], now["versions"]):
    if a and b and a != b:
      raise errors.DataError(f"{what}: shard {name} of {ds.root} was rewritten since it was scored (version then "
                             f"{a}, now {b}): its ids name other pairs now; score and filter it again")


def _digest(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def write_filter(path: str, identities: list[dict], bit_arrays: list[np.ndarray], rule: dict, scorer: dict,
                 extra: dict | None = None) -> dict:
  """FILTER_DIR/kept-<d>-<digest>.npy per dataset, then manifest.json (written last: its presence says the filter
  is whole). Returns the manifest."""
  fileio.makedirs(path)
  datasets, digests = [], []
  for d, (ident, bits) in enumerate(zip(identities, bit_arrays)):
    buf = io.BytesIO()
    np.save(buf, np.asarray(bits, np.uint8))
    data = buf.getvalue()
    digest = _digest(data)
    name = f"kept-{d}-{digest[:16]}.npy"
    fileio.write_bytes(fileio.join(path, name), data)
    kept = KeptSet(bits, ident["num_examples"]).kept
    datasets.append(dict(ident, file=name, kept=int(kept)))
    digests.append(digest)
  manifest = dict(format=FORMAT, version=VERSION, rule=rule, scorer=scorer, datasets=datasets,
                  digest=_digest(json.dumps([rule, digests]).encode())[:24], **(extra or {}))
  fileio.write_text(fileio.join(path, "manifest.json"), json.dumps(manifest, indent=1))
  return manifest


def read_manifest(path: str) -> dict:
  try:
    manifest = json.loads(fileio.read_text(fileio.join(path, "manifest.json")))
  except FileNotFoundError:
    raise errors.DataError(f"input.web.filter={path!r}: no manifest.json there: write the filter with "
                           f"`ncjax filter --scores=SCORES_DIR --keep=FRACTION --output={path}`") from None
  if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
    raise errors.DataError(f"{path}/manifest.json is not an ncjax filter of version {VERSION} (format "
                           f"{manifest.get('format')!r}, version {manifest.get('version')!r}): write it again")
  return manifest


def _bits(path: str, name: str, cache_dir: str, cache_bytes: int) -> np.ndarray:
  """FILTER_DIR/name memory-mapped: in place on local disk, else from this host's cache (ncjax.data.web.host_cache:
  content-addressed, one process per host downloads it, least recently used files evicted beyond `cache_bytes`)."""
  from ncjax.data.web import host_cache
  if not fileio.is_remote(path):
    return np.load(fileio.join(path, name), mmap_mode="r")
  return host_cache.mapped(path, [name], cache_dir, cache_bytes=cache_bytes)[name]


def open_subset(path: str, datasets, cache_dir: str = "", cache_bytes: int = 32 << 30) -> Subset:
  """The filter at `path` for the training datasets `datasets` (in the mixture's order): each checked against the
  dataset it was chosen from (one error naming the difference), its bits memory-mapped."""
  manifest = read_manifest(path)
  recorded = manifest["datasets"]
  if len(recorded) != len(datasets):
    raise errors.ConfigurationError(
        f"input.web.filter={path!r} was written for {len(recorded)} datasets ({', '.join(d['root'] for d in recorded)})"
        f", this run trains on {len(datasets)}: score and filter the same web:... spec")
  kept = []
  for d, (ident, ds) in enumerate(zip(recorded, datasets)):
    check_identity(ident, ds, f"input.web.filter={path!r} (dataset {d}, {ident['name']})")
    bits = _bits(path, ident["file"], cache_dir, cache_bytes)
    k = KeptSet(bits, ident["num_examples"])
    if k.kept != ident["kept"]:
      raise errors.DataError(f"{path}/{ident['file']} holds {k.kept} kept pairs, its manifest says {ident['kept']}: "
                             f"the filter is damaged; write it again")
    if k.kept == 0:
      raise errors.DataError(f"input.web.filter={path!r} keeps no pair of {ident['root']}: choose a larger --keep "
                             f"or a lower --min_score")
    kept.append(k)
  return Subset(path, manifest, kept)


# ---------------------------------------------------------------------------------------------------------------
# choosing the kept pairs from score files
# ---------------------------------------------------------------------------------------------------------------
def ordered_keys(scores: np.ndarray) -> np.ndarray:
  """float32 scores as uint32 keys in the same order (a larger key is a higher score): the sign bit flipped for
  positive numbers, every bit for negative ones."""
  u = np.ascontiguousarray(scores, np.float32).view(np.uint32)
  return np.where(u & np.uint32(0x80000000), ~u, u | np.uint32(0x80000000))


def score_of_key(key: int) -> float:
  u = np.uint32(key)
  raw = u & np.uint32(0x7FFFFFFF) if u & np.uint32(0x80000000) else ~u
  return float(np.asarray([raw], np.uint32).view(np.float32)[0])


def _top_bin(hist: np.ndarray, target: int) -> tuple[int, int]:
  """(the bin holding the target-th largest key, how many keys lie in bins above it)."""
  above = np.concatenate([np.cumsum(hist[::-1])[::-1][1:], [0]])   # keys in bins strictly above each bin
  b = int(np.flatnonzero(above + hist >= target)[-1])
  return b, int(above[b])


def choose(out: str, *, keep: float | None = None, min_score: float | None = None, per_dataset: bool = False,
           on_shard=None) -> tuple[list[np.ndarray], dict]:
  """The kept flags of every dataset scored under OUT/scores, as bit arrays (ncjax.data.web.subset's format), and
  what was decided. `keep`: the fraction of scored pairs with the highest scores (exactly round(keep * n) of
  them: the last score's ties broken by the lower id); `min_score`: every pair scoring at least that; with
  `per_dataset`, the fraction is taken of each dataset of a mixture apart. Bad records (no score) are never kept.

  Memory: two histograms of 65,536 counts per group and one shard's columns: the exact k-th largest score comes from
  a histogram of the keys' upper 16 bits, then one of the lower 16 bits inside the bin that holds it (three scans
  of the score column). `on_shard(d, s, first, n, columns, kept)` sees each shard's kept flags (for kept keys)."""
  from ncjax.data.web import score_files
  if (keep is None) == (min_score is None):
    raise errors.ConfigurationError("a filter keeps a fraction (--keep=0.7) or a threshold (--min_score=0.2): give "
                                    "one of them")
  if keep is not None and not 0.0 < keep <= 1.0:
    raise errors.ConfigurationError(f"--keep must be in (0, 1], got {keep}")
  manifest = score_files.require_manifest(out)
  absent = score_files.missing(out, manifest)
  if absent:
    raise errors.DataError(f"{len(absent)} of the shards' score files are missing under {score_files.scores_dir(out)}"
                           f" (e.g. {absent[0]}): the audit did not finish; run the same audit command again to "
                           f"score the rest")
  num = len(manifest["datasets"])
  group = (lambda d: d) if per_dataset else (lambda d: 0)
  groups = num if per_dataset else 1
  decided = dict(keep=keep, min_score=min_score, per_dataset=bool(per_dataset))
  n_valid = np.zeros(groups, np.int64)
  bad = np.zeros(num, np.int64)
  threshold = [None] * groups                      # (key, ties to take) per group
  if keep is not None:
    hist = np.zeros((groups, 1 << 16), np.int64)
    for d, _, _, _, cols in score_files.scan(out, manifest, ["score"]):
      s = cols["score"]
      valid = ~np.isnan(s)
      bad[d] += int((~valid).sum())
      n_valid[group(d)] += int(valid.sum())
      hist[group(d)] += np.bincount(ordered_keys(s[valid]) >> 16, minlength=1 << 16)
    targets = [int(round(keep * n)) for n in n_valid]
    his = [(None, 0) if t == 0 else _top_bin(hist[g], t) for g, t in enumerate(targets)]
    low = np.zeros((groups, 1 << 16), np.int64)
    for d, _, _, _, cols in score_files.scan(out, manifest, ["score"]):
      g = group(d)
      if his[g][0] is None:
        continue
      k = ordered_keys(cols["score"][~np.isnan(cols["score"])])
      low[g] += np.bincount(k[(k >> 16) == his[g][0]] & 0xFFFF, minlength=1 << 16)
    for g, t in enumerate(targets):
      if his[g][0] is None:
        continue
      lo, above = _top_bin(low[g], t - his[g][1])
      key = (his[g][0] << 16) | lo
      threshold[g] = (key, t - his[g][1] - above)
    decided["targets"] = targets
    decided["thresholds"] = [None if th is None else score_of_key(th[0]) for th in threshold]
  writers = [BitWriter() for _ in range(num)]
  ties_left = [0 if th is None else th[1] for th in threshold]
  kept_counts = np.zeros(num, np.int64)
  columns = ["score", "key"] if on_shard is not None else ["score"]
  for d, s, first, n, cols in score_files.scan(out, manifest, columns):
    scores = cols["score"]
    valid = ~np.isnan(scores)
    if keep is None:
      kept = valid & (np.where(valid, scores, -np.inf) >= min_score)
      bad[d] += int((~valid).sum())
    else:
      g = group(d)
      kept = np.zeros(n, bool)
      if threshold[g] is not None:
        key = np.zeros(n, np.uint32)
        key[valid] = ordered_keys(scores[valid])
        kept = valid & (key > np.uint32(threshold[g][0]))
        tie = np.flatnonzero(valid & (key == np.uint32(threshold[g][0])))[:ties_left[g]]
        kept[tie] = True
        ties_left[g] -= len(tie)
    writers[d].add(kept)
    kept_counts[d] += int(kept.sum())
    if on_shard is not None:
      on_shard(d, s, first, n, cols, kept)
  decided.update(kept=[int(k) for k in kept_counts], bad=[int(b) for b in bad],
                 scored=[int(ds["num_examples"]) - int(b) for ds, b in zip(manifest["datasets"], bad)])
  return [w.finish() for w in writers], decided


def write_from_scores(out: str, path: str, *, keep: float | None = None, min_score: float | None = None,
                      per_dataset: bool = False, keys: bool = False) -> dict:
  """`ncjax filter`: choose the kept pairs from the score files under `out` and write the filter directory `path`
  (with `keys`, also `path`/kept_keys/d<d>.parquet: shard, key, id and score of every kept pair, for tools outside
  ncjax). Returns the filter's manifest."""
  from ncjax.data.web import score_files
  manifest = score_files.require_manifest(out)
  writers = {}
  tmp_dir = None

  def on_shard(d, s, first, n, cols, kept):
    import pyarrow as pa
    import pyarrow.parquet as pq
    if d not in writers:
      target = fileio.join(path, "kept_keys", f"d{d}.parquet")
      local = target
      if fileio.is_remote(path):
        nonlocal tmp_dir
        import tempfile
        tmp_dir = tmp_dir or tempfile.mkdtemp(prefix="ncjax-keys-")
        local = os.path.join(tmp_dir, f"d{d}.parquet")
      else:
        fileio.makedirs(fileio.dirname(target))
      schema = pa.schema([("shard", pa.string()), ("key", pa.string()), ("id", pa.int64()), ("score", pa.float32())])
      writers[d] = (pq.ParquetWriter(local, schema, compression="zstd"), local, target)
    where = np.flatnonzero(kept)
    if len(where):
      name = manifest["datasets"][d]["shards"][s]
      keys_ = [cols["key"][i] for i in where]
      writers[d][0].write_table(pa.table({"shard": [name] * len(where), "key": keys_, "id": first + where,
                                          "score": cols["score"][where].astype(np.float32)}))

  bits, decided = choose(out, keep=keep, min_score=min_score, per_dataset=per_dataset,
                         on_shard=on_shard if keys else None)
  for writer, local, target in writers.values():
    writer.close()
    if local != target:
      fileio.copy_file(local, target)
      os.remove(local)
  identities = [{k: ds[k] for k in ("root", "name", "shards", "counts", "sizes", "num_examples", "versions")
                 if k in ds} for ds in manifest["datasets"]]
  rule = dict(keep=keep, min_score=min_score, per_dataset=bool(per_dataset))
  return write_filter(path, identities, bits, rule, manifest["scorer"],
                      extra=dict(scores=fileio.absolute(out), decided=decided,
                                 kept_keys=sorted(f"kept_keys/d{d}.parquet" for d in writers)))


# ---------------------------------------------------------------------------------------------------------------
# the kept pairs as new img2dataset-layout shards (for tools outside ncjax)
# ---------------------------------------------------------------------------------------------------------------
def write_shards(path: str, out_root: str, process_index: int = 0, process_count: int = 1) -> int:
  """The kept pairs of the filter at `path` as img2dataset output under `out_root` (dataset d's shards under
  out_root/d<d>/ when the filter covers several): each source shard streamed once and written as a tar of its kept
  samples (their members as they were), a parquet of (key, caption, status, url) and a _stats.json. Shard g (in id
  order) belongs to process g mod P; returns the pairs this process wrote. Memory: one shard's kept samples."""
  from ncjax.data.web import pinned_stream, tar
  manifest = read_manifest(path)
  written, g = 0, 0
  for d, ident in enumerate(manifest["datasets"]):
    bits = _bits(path, ident["file"], "", 32 << 30)
    kept = KeptSet(bits, ident["num_examples"])
    base = out_root if len(manifest["datasets"]) == 1 else fileio.join(out_root, f"d{d}")
    first = 0
    versions = ident.get("versions") or [""] * len(ident["shards"])
    for name, n, size, version in zip(ident["shards"], ident["counts"], ident["sizes"], versions):
      mine = g % process_count == process_index
      g += 1
      flags = kept.flags(first, first + n) if mine else None
      first += n
      if not mine:
        continue
      chunks, rows = [], dict(key=[], caption=[], status=[], url=[])
      j = 0
      try:
        # the shard that was scored, and no other version of it (a filter names its pairs by their ids)
        pin = f"{size}:{version.split(':')[0]}" if version and size >= 0 else ""
        with pinned_stream.open_stream(fileio.join(ident["root"], name), pin) as f:
          for key, _, _, parts in tar.iter_samples(f):
            if j >= n:
              break
            if flags[j]:
              for ext, data in parts.items():
                chunks.append(tar.tar_member(f"{key}.{ext}", data))
              sample = tar.make_sample(0, key, parts)
              meta = sample.json()
              rows["key"].append(key)
              rows["caption"].append(sample.caption or "")
              rows["status"].append("success")
              rows["url"].append(meta.get("url"))
            j += 1
      except tar.CorruptShard:
        pass   # the rest of a cut shard: bad records, never kept by a filter (they have no score)
      stem = fileio.join(base, name[:-len(".tar")] if name.endswith(".tar") else name)
      fileio.write_bytes(stem + ".tar", b"".join(chunks) + tar.tar_end())
      tar.write_parquet(stem + ".parquet", rows)
      fileio.write_text(stem + "_stats.json", json.dumps(dict(count=len(rows["key"]), successes=len(rows["key"]),
                                                               failed_to_download=0, failed_to_resize=0)))
      written += len(rows["key"])
  return written
