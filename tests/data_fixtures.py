"""Small datasets in the real on-disk formats, written by the tests (nothing downloaded)."""

import io
import json
import os
import tarfile

import numpy as np
from PIL import Image

COLORS = ["red", "green", "blue", "yellow", "white", "black", "purple", "orange"]


def jpeg(seed: int, size=(40, 30)) -> bytes:
  rng = np.random.default_rng(seed)
  buf = io.BytesIO()
  Image.fromarray(rng.integers(0, 255, size=(size[1], size[0], 3), dtype=np.uint8)).save(buf, format="JPEG")
  return buf.getvalue()


def _add(tar, name, data: bytes):
  info = tarfile.TarInfo(name)
  info.size = len(data)
  tar.addfile(info, io.BytesIO(data))


def write_webdataset(directory, n_per_shard=6, shards=2, corrupt=(2,), empty_caption=(4,)):
  """img2dataset-style shards: <key>.jpg + <key>.txt + <key>.json (with a subreddit)."""
  os.makedirs(directory, exist_ok=True)
  i = 0
  captions = []
  for s in range(shards):
    with tarfile.open(os.path.join(directory, f"{s:05d}.tar"), "w") as tar:
      for _ in range(n_per_shard):
        key = f"{s:05d}{i:04d}"
        cap = "" if i in empty_caption else f"a photo of a {COLORS[i % len(COLORS)]} thing number {i}"
        captions.append(cap)
        _add(tar, f"{key}.jpg", b"\xff\xd8 this is not a jpeg" if i in corrupt else jpeg(i, (40 + i, 30)))
        _add(tar, f"{key}.txt", cap.encode())
        _add(tar, f"{key}.json", json.dumps({"key": key, "caption": cap,
                                             "subreddit": "cats" if i % 3 == 0 else "pics"}).encode())
        i += 1
  return captions


def write_table(directory, n=10, separator=","):
  os.makedirs(os.path.join(directory, "imgs"), exist_ok=True)
  rows = []
  for i in range(n):
    path = os.path.join("imgs", f"{i}.jpg")
    with open(os.path.join(directory, path), "wb") as f:
      f.write(jpeg(100 + i))
    rows.append((path, f"{COLORS[i % 8]} square {i}"))
  with open(os.path.join(directory, "pairs.csv"), "w") as f:
    f.write(separator.join(["path", "caption"]) + "\n")
    for p, c in rows:
      f.write(separator.join([p, c]) + "\n")
  return rows


def write_karpathy(directory, name="flickr30k"):
  """dataset_<name>.json + flickr30k-images/: train 3 images (1 'restval'), val 1, test 2 with 6 and 7 captions."""
  img_dir = os.path.join(directory, "flickr30k-images")
  os.makedirs(img_dir, exist_ok=True)
  layout = [("train", 5), ("train", 5), ("restval", 5), ("val", 5), ("test", 6), ("test", 7)]
  images, sent = [], 0
  for i, (split, k) in enumerate(layout):
    fn = f"{1000 + i}.jpg"
    with open(os.path.join(img_dir, fn), "wb") as f:
      f.write(jpeg(200 + i, (50, 40)))
    sentences = [{"raw": f"image {i} described by sentence {j} in {COLORS[(i + j) % 8]}", "sentid": sent + j}
                 for j in range(k)]
    sent += k
    images.append({"filename": fn, "imgid": i, "split": split, "sentences": sentences})
  with open(os.path.join(directory, f"dataset_{name}.json"), "w") as f:
    json.dump({"images": images, "dataset": name}, f)
  return layout


def write_precomp(directory, n_train=4, n_test=2, regions=36, dim=2048, tsv=False):
  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng(0)
  for split, n in (("train", n_train), ("test", n_test), ("dev", n_test)):
    np.save(os.path.join(directory, f"{split}_ims.npy"), rng.normal(size=(n, regions, dim)).astype(np.float32))
    if tsv:
      with open(os.path.join(directory, f"{split}_caps.tsv"), "w") as f:
        for i in range(n):
          f.write(f"{9000 + i}\tcc caption {split} {i}\n")
    else:
      with open(os.path.join(directory, f"{split}_caps.txt"), "w") as f:
        for i in range(5 * n):
          f.write(f"{split} caption {i} of image {i // 5}\n")
