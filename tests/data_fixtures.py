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
                                             "subreddit": "cats" if i % 3 == 0 else "pics",
                                             "label": i % 3, "clean": int(i % 4 != 0)}).encode())
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


CIFAR10_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def write_image_folder(root, classes=("n01440764", "n01443537", "n01484850"), per_class=(3, 2), size=24,
                       readable=("tench", "goldfish", "great white shark")):
  """An ImageNet-style tree root/{train,test}/<wnid>/*.png with classnames.txt ('wnid<TAB>name' lines)."""
  import os
  rng = np.random.default_rng(0)
  for split, n in zip(("train", "test"), per_class):
    for k, c in enumerate(classes):
      os.makedirs(os.path.join(root, split, c), exist_ok=True)
      for i in range(n):
        _png(os.path.join(root, split, c, f"{i}.png"), rng, size, shade=k)
  with open(os.path.join(root, "classnames.txt"), "w") as f:
    f.write("".join(f"{c}\t{r}\n" for c, r in zip(classes, readable)))
  return root


def _png(path, rng, size, shade=0):
  from PIL import Image
  arr = rng.integers(0, 255, (size, size + 6, 3), dtype=np.uint8)
  arr[..., shade % 3] = 200
  Image.fromarray(arr).save(path)


def write_prepared_tfds(data_dir, name="cifar10", names=CIFAR10_NAMES, n_train=30, n_test=20, tfrecord=False):
  """A classification dataset prepared by tfds itself (GeneratorBasedBuilder, ArrayRecord files), optionally
  rewritten as TFRecord files (the format most users' prepared datasets are in). Returns the labels by split, in
  the order tfds wrote them."""
  import io
  import json
  import os
  import tensorflow_datasets as tfds
  from PIL import Image

  class Fixture(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version("3.0.2")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
          "id": tfds.features.Text(), "image": tfds.features.Image(shape=(32, 32, 3)),
          "label": tfds.features.ClassLabel(names=list(names))}), supervised_keys=("image", "label"))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples(n_train, 0), "test": self._generate_examples(n_test, 1)}

    def _generate_examples(self, n, seed):
      rng = np.random.default_rng(seed)
      for i in range(n):
        b = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(b, format="PNG")
        yield i, {"id": str(i), "image": b.getvalue(), "label": i % len(names)}

  Fixture.name = name
  builder = Fixture(data_dir=data_dir, file_format="array_record")
  builder.download_and_prepare()
  path = builder.data_dir
  labels = {s: [int(r["label"]) for r in builder.as_data_source(split=s)] for s in ("train", "test")}
  if tfrecord:
    from array_record.python.array_record_module import ArrayRecordReader
    for f in sorted(os.listdir(path)):
      if ".array_record-" not in f:
        continue
      reader = ArrayRecordReader(os.path.join(path, f))
      records = reader.read_all()
      reader.close()
      with open(os.path.join(path, f.replace(".array_record-", ".tfrecord-")), "wb") as out:
        for rec in records:
          out.write(_tfrecord_frame(rec))
      os.remove(os.path.join(path, f))
    info_path = os.path.join(path, "dataset_info.json")
    with open(info_path) as f:
      info = json.load(f)
    info["fileFormat"] = "tfrecord"
    with open(info_path, "w") as f:
      json.dump(info, f)
  return labels


def _crc32c(data: bytes) -> int:
  crc = 0xFFFFFFFF
  for byte in data:
    crc ^= byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
  return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _tfrecord_frame(record: bytes) -> bytes:
  import struct
  header = struct.pack("<Q", len(record))
  return (header + struct.pack("<I", _masked(_crc32c(header))) + record
          + struct.pack("<I", _masked(_crc32c(record))))


def write_labelled_table(directory, n=24, separator=","):
  """A table with a class label (a name), a ground-truth clean flag and an image path per row; every third caption
  names the wrong shape (clean = 0). Returns the rows as dicts."""
  os.makedirs(os.path.join(directory, "imgs"), exist_ok=True)
  shapes = ("circle", "square", "triangle")
  rows = []
  for i in range(n):
    path = os.path.join("imgs", f"{i}.jpg")
    with open(os.path.join(directory, path), "wb") as f:
      f.write(jpeg(50 + i))
    shape = shapes[i % 3]
    noisy = i % 3 == 2
    said = shapes[(i + 1) % 3] if noisy else shape
    rows.append(dict(path=path, caption=f"a {COLORS[i % 8]} {said}", label=shape, clean=0 if noisy else 1))
  with open(os.path.join(directory, "pairs.csv"), "w") as f:
    f.write(separator.join(["path", "caption", "label", "clean"]) + "\n")
    for r in rows:
      f.write(separator.join([r["path"], r["caption"], r["label"], str(r["clean"])]) + "\n")
  with open(os.path.join(directory, "names.txt"), "w") as f:
    f.write("\n".join(shapes) + "\n")
  return rows
