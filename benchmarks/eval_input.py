"""Evaluation input: images/s of a zero-shot evaluation's image input (read the file, decode the JPEG, resize the
shortest side to 224 bicubic, centre crop, normalise) on a 10,000-image ImageFolder tree, serially (the loop
`ncjax/data/tables/sources.py` ran before `input.eval_workers`) and with thread and process workers.

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


def _old_serial_view(split, size: int):
  """The evaluation input before `input.eval_workers`: one image at a time, decoded to an array
  (`readers.decode_image`), then the evaluation transform — the loop ncjax/data/tables/sources.py ran until 2026-11-23."""
  from ncjax.data import preprocess
  from ncjax.data.tables import readers

  class OldView:
    def __getitem__(self, ids):
      return np.stack([preprocess.eval_transform(readers.decode_image(split.images.raw(int(i))), size, "openai",
                                                 "shortest") for i in ids])

    def close(self):
      pass
  return OldView()


def run(quick: bool = False, n: int | None = None, rounds: int = 5) -> dict:
  """Every mode reads the same n images; the images are cut into `rounds` parts and the modes take turns on each
  part (serial, threads, processes, serial, ...), so that a change in the machine's other load during the run
  falls on every mode alike."""
  from ncjax.data.tables import classification
  from ncjax.data.tables import sources
  n = n or (1000 if quick else 10_000)
  root = write_folder(os.path.join(common.RESULTS_DIR, f"eval_input_images_{n}"), n)
  split = classification.load_image_folder(root, "val")
  cores = sources.usable_cores()
  batch, devices = 512, 8
  modes = [("serial, before (decode_image + eval_transform)", 0, "old"),
           ("serial (input.eval_workers=0)", 0, "thread"),
           (f"threads (eval_workers={cores})", cores, "thread"),
           (f"processes (eval_workers={cores}, eval_decode=process)", cores, "process")]
  views = {}
  for label, workers, decode in modes:
    views[label] = (_old_serial_view(split, 224) if decode == "old" else
                    sources.TransformedImages(split.images, 224, "openai", "shortest", workers=workers,
                                              decode=decode))
    if workers > 1 and decode == "process":
      views[label][np.arange(min(2 * cores, n))]    # start the workers (spawned interpreters) outside the timing
  seconds = {label: 0.0 for label, _, _ in modes}
  checks = {label: [] for label, _, _ in modes}
  load = []
  edges = np.linspace(0, n, rounds + 1).astype(int)
  for r in range(rounds):
    for label, _, _ in modes:
      view = views[label]
      load.append(os.getloadavg()[0])
      sec, checksum = throughput(_Offset(view, edges[r]), edges[r + 1] - edges[r], batch, devices)
      seconds[label] += sec
      checks[label].append(checksum)
  for label, _, _ in modes:
    views[label].close()
    np.testing.assert_array_equal(np.concatenate(checks[label]), np.concatenate(checks[modes[0][0]]))
  rows = [dict(mode=label, workers=max(workers, 1), images=n, seconds=seconds[label],
               images_per_sec=n / seconds[label]) for label, workers, _ in modes]
  for r in rows:
    r["speedup"] = r["images_per_sec"] / rows[0]["images_per_sec"]
  payload = dict(rows=rows, cores=cores, image_size=224, source="500x375 JPEG, ImageFolder", batch=batch,
                 devices=devices, rounds=rounds, load_average_1min=dict(min=min(load), max=max(load)))
  common.write("eval_input", payload)
  common.report(f"Evaluation input: {n:,} JPEGs (500x375) -> 224 px, batches of {batch} read per device "
                f"({devices} devices), {cores} usable cores; 1-min load average during the run "
                f"{min(load):.1f}-{max(load):.1f}",
                rows, [("mode", "mode", "s"), ("workers", "workers", "d"), ("seconds", "s", ".1f"),
                       ("images_per_sec", "images/s", ",.0f"), ("speedup", "x before", ".2f")])
  return payload


class _Offset:
  """Rows [start, ...) of a view, indexed from 0."""

  def __init__(self, view, start: int):
    self.view, self.start = view, int(start)

  def __getitem__(self, ids):
    return self.view[np.asarray(ids) + self.start]
