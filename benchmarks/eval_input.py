"""Evaluation input: images/s of a zero-shot evaluation's image input (read the file, decode the JPEG, resize the
shortest side to 224 bicubic, centre crop, normalise) on a 10,000-image ImageFolder tree, serially (the loop
`ncjax/data/sources.py` ran before `input.eval_workers`) and with thread and process workers.

The images are read as an evaluator reads them: global batches of `input.eval_batch_size` rows, each fetched one
device's rows at a time (`ncjax.evals.common._batched_apply` builds each device's shard with its own call), so
this is the input side of `ncjax eval` on an ImageNet-style folder. The outputs of every mode are checked equal to
the serial loop's."""

from __future__ import annotations

import os
import time

import numpy as np
from PIL import Image

from benchmarks import common


def write_folder(root: str, n: int, classes: int = 10, size=(500, 375)) -> str:
  """n JPEGs (quality 90) of a typical web size in `classes` class folders: ROOT/val/class_k/NNNNNN.jpg. Kept between
  runs (the tree takes about a minute to write)."""
  base = os.path.join(root, "val")
  stamp = os.path.join(root, f".complete_{n}")
  if os.path.isfile(stamp):
    return root
  rng = np.random.default_rng(0)
  low = rng.integers(0, 255, size=(size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
  for k in range(classes):
    os.makedirs(os.path.join(base, f"class_{k}"), exist_ok=True)
  for i in range(n):
    img = Image.fromarray(np.roll(low, i, axis=1)).resize(size, Image.BILINEAR)
    img.save(os.path.join(base, f"class_{i % classes}", f"{i:06d}.jpg"), quality=90)
  open(stamp, "w").close()
  return root


def throughput(view, n: int, batch: int, devices: int) -> tuple[float, np.ndarray]:
  """Seconds to read the first n rows of `view` as _batched_apply does, and a checksum row per batch."""
  per_device = batch // devices
  sums = []
  t = time.perf_counter()
  for start in range(0, n, batch):
    for d in range(devices):
      lo = start + d * per_device
      if lo >= n:
        break
      rows = view[np.arange(lo, min(lo + per_device, n))]
      sums.append(rows.reshape(len(rows), -1).sum(axis=1))
  return time.perf_counter() - t, np.concatenate(sums)


def run(quick: bool = False, n: int | None = None) -> dict:
  from ncjax.data import classification, sources
  n = n or (1000 if quick else 10_000)
  root = write_folder(os.path.join(common.RESULTS_DIR, f"eval_input_images_{n}"), n)
  split = classification.load_image_folder(root, "val")
  cores = sources.usable_cores()
  batch, devices = 512, 8
  rows, reference = [], None
  modes = [("serial (before)", 0, "thread"), ("threads", cores, "thread"), ("processes", cores, "process")]
  for label, workers, decode in modes:
    view = sources.TransformedImages(split.images, 224, "openai", "shortest", workers=workers, decode=decode)
    if workers > 1 and decode == "process":
      view[np.arange(min(2 * cores, n))]    # start the workers (spawned interpreters) outside the timing
    seconds, checksum = throughput(view, n, batch, devices)
    view.close()
    if reference is None:
      reference = checksum
    np.testing.assert_array_equal(checksum, reference)   # the same arrays as the serial loop
    rows.append(dict(mode=label, workers=max(workers, 1), images=n, seconds=seconds, images_per_sec=n / seconds))
  for r in rows:
    r["speedup"] = r["images_per_sec"] / rows[0]["images_per_sec"]
  payload = dict(rows=rows, cores=cores, image_size=224, source="500x375 JPEG, ImageFolder", batch=batch,
                 devices=devices)
  common.write("eval_input", payload)
  common.report(f"Evaluation input: {n:,} JPEGs (500x375) -> 224 px, batches of {batch} read per device "
                f"({devices} devices), {cores} usable cores",
                rows, [("mode", "mode", "s"), ("workers", "workers", "d"), ("seconds", "s", ".1f"),
                       ("images_per_sec", "images/s", ",.0f"), ("speedup", "x serial", ".2f")])
  return payload
