"""The embedded default dataset: image-caption pairs from scikit-learn's bundled handwritten digits.

1,797 real 8x8 grey-level scans (UCI optdigits), shipped inside the scikit-learn wheel, so nothing is downloaded.
Each image is upsampled (bicubic) to the model's resolution and replicated to 3 channels. Captions are generated
from the label *and from measured properties of the scan* — ink weight, slant and width — with varied templates,
so that retrieval is not only class matching. The train/test split is fixed (stratified, seed 0); stable ids are
the scikit-learn row numbers. Test images get two captions each (different templates).
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import itertools
import os
import string

import numpy as np
from PIL import Image

from ncjax.data.types import PairSplit

CLASS_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")

# Zero-shot prompts, class-level only (no per-image attributes): template set 'digits_plain' (the default until 2026-11-22).
PLAIN_TEMPLATES = (
    "a photo of the number {}.",
    "a handwritten {}.",
    "the digit {}.",
    "a scan of a handwritten number {}.",
)

_TEMPLATES = (
    "a {ink} handwritten {name}, {slant}.",
    "the digit {name} written in {ink} strokes, {slant}.",
    "a {width} {name} drawn with {ink} ink.",
    "a scan of a handwritten number {name}, {ink} and {slant}.",
    "a photo of the number {name}, {width} and {slant}.",
    "the number {digit} written by hand, {width}, {ink}.",
)
_INK = ("faint", "medium", "heavy")
_SLANT = ("leaning left", "upright", "leaning right")
_WIDTH = ("narrow", "wide")



def _attribute_ensemble() -> tuple[str, ...]:
  """The caption templates with every attribute value filled in and the class left open — like CLIP's 80 ImageNet
  prompts ('a bad photo of a {}', 'a photo of a large {}', ...), prompts in the style of the training captions that
  marginalise the attributes out: no per-image information, so still zero-shot. (The numeral template is left out:
  a class name cannot fill it.) On clean digits this ensemble scores 1.5-2.5 points above the plain prompts."""
  values = dict(ink=_INK, slant=_SLANT, width=_WIDTH)
  out = []
  for template in _TEMPLATES:
    fields = [f for _, f, _, _ in string.Formatter().parse(template) if f]
    if "digit" in fields:
      continue
    keys = [f for f in fields if f != "name"]
    for combo in itertools.product(*(values[k] for k in keys)):
      out.append(template.format(name="{}", **dict(zip(keys, combo))))
  return tuple(out)


# Zero-shot prompts (template set 'digits', the default on digits): the attribute-marginalised caption templates.
ZEROSHOT_TEMPLATES = _attribute_ensemble()

MEAN, STD = 0.5, 0.5  # pixel normalisation: [0, 1] -> [-1, 1]
TEST_FRACTION = 0.2
SPLIT_SEED = 0


@functools.lru_cache(maxsize=1)
def _raw():
  """The 1,797 8x8 scans (0-16 ink levels) and their labels: the CSV scikit-learn bundles (no download), read
  directly — what `sklearn.datasets.load_digits` reads, without the ~2.5 s of importing scikit-learn each process
  would pay."""
  spec = importlib.util.find_spec("sklearn")      # finds the package without importing it
  path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz") if spec else ""
  if os.path.exists(path):
    with gzip.open(path, "rt") as f:
      data = np.loadtxt(f, delimiter=",")
    images, target = data[:, :-1].reshape(-1, 8, 8), data[:, -1]
  else:                                           # another layout of scikit-learn: its loader
    from sklearn.datasets import load_digits
    d = load_digits()
    images, target = d.images, d.target
  return images.astype(np.float32) / 16.0, target.astype(np.int64)


def _terciles(values: np.ndarray, bins: int) -> np.ndarray:
  edges = np.quantile(values, np.linspace(0, 1, bins + 1)[1:-1])
  return np.searchsorted(edges, values, side="right")


def image_attributes(images: np.ndarray) -> dict[str, np.ndarray]:
  """Ink weight, slant and width measured from each 8x8 scan, as discrete levels."""
  n = len(images)
  ys, xs = np.mgrid[0:8, 0:8].astype(np.float32)
  mass = images.reshape(n, -1).sum(axis=1) + 1e-6
  mx = (images * xs).reshape(n, -1).sum(1) / mass
  my = (images * ys).reshape(n, -1).sum(1) / mass
  cov_xy = (images * (xs - mx[:, None, None]) * (ys - my[:, None, None])).reshape(n, -1).sum(1) / mass
  var_y = (images * (ys - my[:, None, None]) ** 2).reshape(n, -1).sum(1) / mass
  # Image rows grow downwards: x decreasing with y means the top leans right.
  slant = -cov_xy / (var_y + 1e-6)
  cols = (images > 0.25).any(axis=1)
  width = cols.sum(axis=1).astype(np.float32)
  return dict(ink=_terciles(mass, 3), slant=_terciles(slant, 3), width=_terciles(width, 2))


def _caption(label: int, attrs: dict, i: int, template: int) -> str:
  return _TEMPLATES[template].format(name=CLASS_NAMES[label], digit=label, ink=_INK[attrs["ink"][i]],
                                     slant=_SLANT[attrs["slant"][i]], width=_WIDTH[attrs["width"][i]])


def split_indices():
  """Fixed stratified split of the 1,797 rows: (train rows, test rows), each sorted."""
  _, labels = _raw()
  rng = np.random.Generator(np.random.PCG64(SPLIT_SEED))
  test = []
  for c in range(10):
    rows = np.flatnonzero(labels == c)
    rows = rng.permutation(rows)
    test.extend(rows[: int(round(TEST_FRACTION * len(rows)))])
  test = np.sort(np.asarray(test))
  train = np.setdiff1d(np.arange(len(labels)), test)
  return train, test


def _resize(images: np.ndarray, size: int) -> np.ndarray:
  if size == 8:
    return images
  out = np.empty((len(images), size, size), np.float32)
  for k, im in enumerate(images):
    out[k] = np.asarray(Image.fromarray(im, mode="F").resize((size, size), Image.BICUBIC))
  return np.clip(out, 0.0, 1.0)


def load(split: str, image_size: int = 16, captions_per_image: int | None = None) -> PairSplit:
  """The digits split ('train' or 'test') as a PairSplit with images of shape (n, image_size, image_size, 3)."""
  if split not in ("train", "test"):
    raise ValueError(f"digits has splits 'train' and 'test', not {split!r}")
  images, labels = _raw()
  attrs = image_attributes(images)
  train_rows, test_rows = split_indices()
  rows = train_rows if split == "train" else test_rows
  k = captions_per_image or (1 if split == "train" else 2)
  rng = np.random.Generator(np.random.PCG64(1000 + (split == "test")))
  captions, c2i = [], []
  for j, row in enumerate(rows):
    for t in rng.choice(len(_TEMPLATES), size=k, replace=False):
      captions.append(_caption(int(labels[row]), attrs, row, int(t)))
      c2i.append(j)
  pixels = _resize(images[rows], image_size)
  pixels = (pixels - MEAN) / STD
  pixels = np.repeat(pixels[..., None], 3, axis=-1).astype(np.float32)
  return PairSplit(images=pixels, captions=captions, caption_to_image=np.asarray(c2i), image_labels=labels[rows],
                   image_ids=rows.astype(np.int64), class_names=CLASS_NAMES, name=f"digits/{split}")
