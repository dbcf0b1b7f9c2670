"""Synthetic img2dataset output (WebDataset tars + parquet + _stats.json), for tests and benchmarks: any number of
pairs, small JPEGs drawn from a pool, captions of web length (a Zipf vocabulary, 8-16 words, each caption distinct),
a few failed downloads per shard (parquet rows with no tar sample, as img2dataset writes them). Generated on the
machine that uses it; nothing is stored in the repository.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np

from ncjax import fileio
from ncjax.data.web import dataset as web

WORDS = tuple(
    "a the of on in with and at to photo picture image view man woman dog cat car tree house street city beach "
    "mountain river sky cloud sunset night day people group child girl boy table food plate cup coffee book phone "
    "computer window door wall room kitchen garden flower field grass road bridge train bus bike boat water lake "
    "sea snow winter summer spring autumn red green blue yellow white black old new small large beautiful happy "
    "young wooden stone glass modern vintage illustration vector background isolated close up portrait stock "
    "design pattern art drawing painting wedding party team player game ball stadium market shop store food "
    "restaurant hotel church castle museum park airport station building tower skyline".split())


def jpeg_pool(count: int, size: int, seed: int = 0, quality: int = 90) -> list[bytes]:
  """`count` distinct JPEGs of size x size: smooth gradients with noise (a natural image's coding cost)."""
  from PIL import Image
  rng = np.random.default_rng(seed)
  out = []
  y, x = np.mgrid[0:size, 0:size] / max(size - 1, 1)
  for i in range(count):
    f = rng.uniform(1, 6, 3)
    chans = [np.sin(f[c] * (x + rng.uniform()) * 3) * np.cos(f[(c + 1) % 3] * y * 3) for c in range(3)]
    img = (np.stack(chans, -1) * 100 + 128 + rng.normal(0, 12, (size, size, 3))).clip(0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=quality)
    out.append(buf.getvalue())
  return out


def captions(first_id: int, n: int, seed: int = 0) -> list[str]:
  """n distinct web-length captions (8-16 words from a Zipf vocabulary, then the pair's number)."""
  rng = np.random.default_rng([seed, first_id])
  ranks = np.minimum(rng.zipf(1.3, size=(n, 16)) - 1, len(WORDS) - 1)
  lengths = rng.integers(8, 17, n)
  return [" ".join(WORDS[r] for r in ranks[i, :lengths[i]]) + f" number {first_id + i}" for i in range(n)]


def write_img2dataset(root: str, num_pairs: int, *, per_shard: int = 10000, image_size: int = 32, pool: int = 64,
                      failed_every: int = 50, clean_key: str = "", noisy_every: int = 0, corrupt_images=(),
                      truncate_shards=(), json_members: bool = True, parquet: bool = True, stats: bool = True,
                      seed: int = 0, images: list[bytes] | None = None, shard_sizes=None,
                      invalid_utf8=()) -> dict:
  """img2dataset's webdataset output for `num_pairs` successful pairs under `root` (local or gs://).

  Every `failed_every`-th attempted row failed to download (in the parquet, not in the tar). With `clean_key`, each
  .json carries a clean flag (0 for every `noisy_every`-th pair). `corrupt_images`: global ids whose image bytes
  are not a JPEG; `truncate_shards`: shards whose tar is cut in the middle of their second half; `shard_sizes`: the
  pairs of each shard (unequal, as img2dataset's are: its shards lose different numbers of failed downloads;
  num_pairs is then their sum); `invalid_utf8`: global ids whose .txt caption is not valid UTF-8. Returns
  {shards, counts, captions (callable id -> caption), image_of (callable id -> bytes)}."""
  images = images or jpeg_pool(pool, image_size, seed)
  corrupt = set(int(i) for i in corrupt_images)
  bad_text = set(int(i) for i in invalid_utf8)
  if shard_sizes is not None:
    num_pairs = int(sum(shard_sizes))
  fileio.makedirs(root)
  counts, shards = [], []
  next_id = 0
  shard = 0
  while next_id < num_pairs:
    n = int(shard_sizes[shard]) if shard_sizes is not None else min(per_shard, num_pairs - next_id)
    caps = captions(next_id, n, seed)
    chunks, rows = [], dict(url=[], key=[], caption=[], status=[], error_message=[], width=[], height=[],
                            original_width=[], original_height=[], exif=[], sha256=[])
    written, attempt = 0, 0
    while written < n:
      key = f"{shard:05d}{attempt:04d}" if attempt < 10000 else f"{shard:05d}{attempt:06d}"
      failed = failed_every and attempt % failed_every == failed_every - 1
      rows["url"].append(f"https://example.com/{shard}/{attempt}.jpg")
      rows["key"].append(key)
      rows["status"].append("failed_to_download" if failed else "success")
      rows["error_message"].append("HTTP 404" if failed else None)
      for col in ("width", "height", "original_width", "original_height"):
        rows[col].append(None if failed else image_size)
      rows["exif"].append(None if failed else "{}")
      rows["sha256"].append(None)
      if failed:
        rows["caption"].append(f"a caption whose image failed {shard} {attempt}")
        attempt += 1
        continue
      gid = next_id + written
      cap = caps[written]
      rows["caption"].append(cap)
      img = b"\xff\xd8 not a jpeg" if gid in corrupt else images[gid % len(images)]
      meta = dict(url=rows["url"][-1], key=key, status="success", caption=cap, width=image_size, height=image_size,
                  original_width=image_size, original_height=image_size, error_message=None)
      if clean_key:
        meta[clean_key] = int(not (noisy_every and gid % noisy_every == 0))
      chunks.append(web.tar_member(f"{key}.jpg", img))
      text = cap.encode("utf-8") if gid not in bad_text else b"caption \xff\xfe not utf-8"
      chunks.append(web.tar_member(f"{key}.txt", text))
      if json_members:
        chunks.append(web.tar_member(f"{key}.json", json.dumps(meta).encode("utf-8")))
      written += 1
      attempt += 1
    data = b"".join(chunks) + web.tar_end()
    if shard in truncate_shards:
      data = data[:len(data) * 3 // 4 + 100]
    stem = fileio.join(root, f"{shard:05d}")
    fileio.write_bytes(stem + ".tar", data)
    if parquet:
      web.write_parquet(stem + ".parquet", rows)
    if stats:
      fileio.write_text(stem + "_stats.json", json.dumps(dict(
          count=attempt, successes=n, failed_to_download=attempt - n, failed_to_resize=0,
          status_dict={"success": n, "HTTP 404": attempt - n})))
    counts.append(n)
    shards.append(stem + ".tar")
    next_id += n
    shard += 1
  starts = np.concatenate([[0], np.cumsum(counts)])

  def caption_of(i):
    s = int(np.searchsorted(starts, i, side="right") - 1)
    return captions(int(starts[s]), int(counts[s]), seed)[i - int(starts[s])]

  return dict(shards=shards, counts=counts, images=images, caption=caption_of,
              image_of=lambda i: b"\xff\xd8 not a jpeg" if i in corrupt else images[i % len(images)])


def write_throughput_jpegs(directory: str, count: int, size: int = 256) -> list[str]:
  """`count` JPEG files of about size x size (the host-input benchmark's inputs)."""
  os.makedirs(directory, exist_ok=True)
  paths = []
  for i, data in enumerate(jpeg_pool(count, size, seed=1)):
    path = os.path.join(directory, f"{i:05d}.jpg")
    with open(path, "wb") as f:
      f.write(data)
    paths.append(path)
  return paths


def write_pairs_img2dataset(root: str, pixels: np.ndarray, captions, *, image_of=None, clean=None,
                            per_shard: int = 500, image_format: str = "png", clean_key: str = "clean") -> dict:
  """Image-caption pairs given as arrays, written as img2dataset's webdataset output under `root` (local or gs://):
  pair k is caption k with image `image_of[k]` (default k) of `pixels` (uint8, (n, h, w, 3); PNG keeps small
  rendered images exact), its .json carrying `clean_key` = clean[k] when `clean` is given — the noise is in the
  data, as on the web, and the flag is ground truth for the audit's evaluation only. Returns {shards, counts}."""
  from PIL import Image
  pixels = np.asarray(pixels, np.uint8)
  n = len(captions)
  image_of = np.arange(n) if image_of is None else np.asarray(image_of, np.int64)
  fileio.makedirs(root)
  shards, counts = [], []
  for s, first in enumerate(range(0, n, per_shard)):
    rows = dict(url=[], key=[], caption=[], status=[], error_message=[], width=[], height=[])
    chunks = []
    for k in range(first, min(n, first + per_shard)):
      key = f"{s:05d}{k - first:04d}"
      buf = io.BytesIO()
      Image.fromarray(pixels[image_of[k]]).save(buf, format=image_format.upper())
      meta = dict(url=f"https://example.com/{k}.{image_format}", key=key, status="success", caption=captions[k],
                  width=int(pixels.shape[2]), height=int(pixels.shape[1]), error_message=None)
      if clean is not None:
        meta[clean_key] = int(bool(clean[k]))
      chunks += [web.tar_member(f"{key}.{image_format}", buf.getvalue()),
                 web.tar_member(f"{key}.txt", captions[k].encode("utf-8")),
                 web.tar_member(f"{key}.json", json.dumps(meta).encode("utf-8"))]
      for col, value in (("url", meta["url"]), ("key", key), ("caption", captions[k]), ("status", "success"),
                         ("error_message", None), ("width", meta["width"]), ("height", meta["height"])):
        rows[col].append(value)
    stem = fileio.join(root, f"{s:05d}")
    fileio.write_bytes(stem + ".tar", b"".join(chunks) + web.tar_end())
    web.write_parquet(stem + ".parquet", rows)
    count = len(rows["key"])
    fileio.write_text(stem + "_stats.json", json.dumps(dict(count=count, successes=count, failed_to_download=0,
                                                             failed_to_resize=0)))
    shards.append(stem + ".tar")
    counts.append(count)
  return dict(shards=shards, counts=counts)
