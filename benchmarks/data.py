"""Input pipeline throughput: 224-px decode + random-resized-crop + normalise + tokenise from a local WebDataset
built with the web_pairs builder, next to the small config's train-step throughput (is training input-bound?)."""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import time

import numpy as np
from PIL import Image

from benchmarks import common


def _write_shards(directory: str, n: int, size=(500, 375)) -> None:
  """n JPEGs of a typical web size (img2dataset's CC3M images are around 500 x 375), with captions."""
  rng = np.random.default_rng(0)
  base = rng.integers(0, 255, size=(size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
  os.makedirs(directory, exist_ok=True)
  per_shard = 256
  for s in range(0, n, per_shard):
    with tarfile.open(os.path.join(directory, f"{s // per_shard:05d}.tar"), "w") as tar:
      for i in range(s, min(n, s + per_shard)):
        img = Image.fromarray(np.roll(base, i, axis=1)).resize(size, Image.BILINEAR)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        for ext, data in (("jpg", buf.getvalue()), ("txt", f"a photo of object {i} on a table".encode())):
          info = tarfile.TarInfo(f"{i:08d}.{ext}")
          info.size = len(data)
          tar.addfile(info, io.BytesIO(data))


def input_throughput(n_images: int = 1024, batch: int = 128, image_size: int = 224) -> dict:
  import ml_collections
  from ncjax.data.tables import sources
  from ncjax.data.tables import builders as tfds_builders
  from ncjax.data.pipeline import TrainData
  from ncjax.sharding import make_mesh
  from ncjax.tokenizers import WordTokenizer
  with tempfile.TemporaryDirectory() as tmp:
    _write_shards(os.path.join(tmp, "wds"), n_images)
    tfds_builders.build("web_pairs", "custom", os.path.join(tmp, "wds"), os.path.join(tmp, "tfds"))
    split = sources.load_tfds_split("tfds:web_pairs/custom", os.path.join(tmp, "tfds"), "train")
    tok = WordTokenizer.build(split.captions, context_length=77)
    mesh = make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1)))
    threads = os.cpu_count() or 1
    td = TrainData(split, tok, batch, 0, mesh, image_size=image_size, augment=True, num_threads=threads,
                   prefetch=4)
    steps = td.steps_per_epoch
    it = td.host_batches(0, steps)
    next(it)  # start-up
    t = time.perf_counter()
    count = 0
    for host in it:
      count += host["image"].shape[0]
    sec = time.perf_counter() - t
  cores = os.cpu_count() or 1
  return dict(bench="input", image_size=image_size, source_size="500x375 JPEG", images=count, seconds=sec,
              images_per_sec=count / sec, images_per_sec_per_core=count / sec / cores, cores=cores,
              reader_threads=threads)


def in_memory_augmentation(batch: int = 256, repeats: int = 20) -> dict:
  """digits' host batch with and without `input.augment` (the batched bilinear random resized crop), one run."""
  import ml_collections
  from ncjax.data.embedded import digits
  from ncjax.data.pipeline import TrainData
  from ncjax.sharding import make_mesh
  from ncjax.tokenizers import WordTokenizer
  split = digits.load("train")
  tok = WordTokenizer.build(split.captions, context_length=16)
  mesh = make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1)))
  out = {}
  for augment in (False, True):
    td = TrainData(split, tok, batch, 0, mesh, augment=augment)
    td.host_batch(td.local_indices(0), 0)
    t = time.perf_counter()
    for s in range(repeats):
      td.host_batch(td.local_indices(s), s)
    out["augmented" if augment else "plain"] = (time.perf_counter() - t) / repeats
  return dict(bench="in_memory_augmentation", batch=batch, plain_ms=1e3 * out["plain"],
              augmented_ms=1e3 * out["augmented"], augmented_over_plain=out["augmented"] / out["plain"])


def run(quick: bool = False) -> dict:
  from benchmarks import foundation
  aug = in_memory_augmentation()
  inp = input_throughput(512 if quick else 2048)
  peak = foundation.matmul_peak()
  step = foundation.train_step("small", 2048, peak["peak_flops"], steps=1 if quick else 2)
  payload = dict(input=inp, small_train_step=step, in_memory_augmentation=aug,
                 input_over_train=inp["images_per_sec"] / step["examples_per_sec"])
  common.write("data", payload)
  print("\nInput pipeline (tfds ArrayRecord -> decode JPEG -> random resized crop 224 -> normalise -> tokenise)")
  print(common.table([inp], [("images", "images", "d"), ("cores", "cores", "d"), ("images_per_sec", "images/s", ",.0f"),
                             ("images_per_sec_per_core", "images/s/core", ",.0f")]))
  print(f"\nsmall CLIP train step at global batch 2048: {step['examples_per_sec']:,.0f} examples/s; the input "
        f"pipeline delivers {payload['input_over_train']:.1f}x that -> "
        f"{'not input-bound' if payload['input_over_train'] > 1 else 'INPUT-BOUND'} on this host")
  print(f"\ndigits host batch of {aug['batch']}: {aug['plain_ms']:.1f} ms plain, {aug['augmented_ms']:.1f} ms with the "
        f"random resized crop ({aug['augmented_over_plain']:.1f}x; prefetched beside the step)")
  return payload
