"""The second embedded dataset, in web data's regime: rendered scenes whose captions describe their own image.

Digits has ten classes, so a shuffled caption still fits about a tenth of the images of its batch; on web data a
mismatched caption is almost always unique to the image it was written for. Each scene here has a background
(grass, sand, sky, night, snow, brick), one large object and one small one (two in 30% of the scenes), each with a
shape, a colour and a position on a 3 x 3 grid; its captions name all of them in varied wording (synonyms, the order
of the objects, the place of the background in the sentence). With 7 x 8 x 9 large objects (shape, colour, cell),
6 backgrounds and 7 x 8 x 8 small ones per slot, almost no two scenes share a description, so a caption fits only its
own image — the premise NCU's masking rests on (unlearn the association a mismatched pair would teach).

Class label (zero-shot): the colour of the large object (8 classes), which means binding a colour to the object the
caption calls large. Measured on 2026-11-23 with `tiny_scenes`, 30 epochs of CLIP: the colour reached 56% on clean
captions and 22% on 40%-noisy ones; the background (6 classes, read off the pixels' mean) 90% and 97% — no signal
of the noise —, and the large object's shape stayed at chance (too hard at 24 px for this budget).
Splits: 'train' (2,000 scenes, one caption each) and 'test' (400 held-out scenes, two captions each, never noisy).
Every scene is a pure function of its id (PCG64([SEED, id])): the data is the same on every machine and needs no
download. Images are drawn at twice the requested size and box-filtered down (anti-aliased edges), then normalised
to [-1, 1].
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from ncjax.data.types import PairSplit

SEED = 20261123
NUM_TRAIN, NUM_TEST = 2000, 400
TEST_ID_OFFSET = 1_000_000   # test scene ids: disjoint from the training ids

SHAPES = ("circle", "square", "triangle", "diamond", "cross", "ring", "bar")
COLOURS = {"red": (0.85, 0.12, 0.10), "green": (0.10, 0.65, 0.15), "blue": (0.12, 0.25, 0.90),
           "yellow": (0.95, 0.85, 0.10), "purple": (0.55, 0.15, 0.70), "orange": (0.98, 0.55, 0.05),
           "white": (0.97, 0.97, 0.97), "black": (0.05, 0.05, 0.05)}
COLOUR_NAMES = tuple(COLOURS)
CLASS_NAMES = COLOUR_NAMES   # the large object's colour
BACKGROUNDS = ("grass", "sand", "sky", "night", "snow", "brick")
# Rows top -> bottom, columns left -> right; each cell has several phrasings.
ROWS = ("top", "middle", "bottom")
COLS = ("left", "center", "right")
_PLACE = {
    (0, 0): ("top left", "upper left", "at top left"),
    (0, 1): ("at the top", "top center", "up top"),
    (0, 2): ("top right", "upper right", "at top right"),
    (1, 0): ("on the left", "left side", "at the left"),
    (1, 1): ("in the center", "in the middle", "at the center"),
    (1, 2): ("on the right", "right side", "at the right"),
    (2, 0): ("bottom left", "lower left", "at bottom left"),
    (2, 1): ("at the bottom", "bottom center", "down low"),
    (2, 2): ("bottom right", "lower right", "at bottom right"),
}
_BACKGROUND_PHRASES = {
    "grass": ("on grass", "on a lawn", "on green grass"),
    "sand": ("on sand", "on a beach", "on the sand"),
    "sky": ("in the sky", "against blue sky", "against the sky"),
    "night": ("at night", "on a dark night", "in the night"),
    "snow": ("on snow", "in the snow", "on snowy ground"),
    "brick": ("on bricks", "against bricks", "by a brick wall"),
}
_LARGE = ("large", "big", "huge")
_SMALL = ("small", "little", "tiny")

# Caption forms: {big} = the large object's phrase, {smalls} = the small objects' phrases, {bg} = the background's.
_FORMS = (
    "{big} {bg}, with {smalls}",
    "{bg}: {big} and {smalls}",
    "{smalls} next to {big}, {bg}",
    "a picture of {big} and {smalls} {bg}",
    "{big} {bg} beside {smalls}",
    "a scene {bg} with {big} and {smalls}",
)


@functools.lru_cache(maxsize=None)
def _grid(size: int):
  c = (np.arange(size, dtype=np.float32) + 0.5) / size   # pixel centres in [0, 1]
  return np.meshgrid(c, c, indexing="xy")


def shape_mask(shape: str, x: np.ndarray, y: np.ndarray, cx: float, cy: float, r: float) -> np.ndarray:
  """Pixels inside `shape` centred at (cx, cy) with half-extent r (image coordinates in [0, 1], y downwards)."""
  dx, dy = x - cx, y - cy
  ax, ay = np.abs(dx), np.abs(dy)
  if shape == "circle":
    return dx * dx + dy * dy <= r * r
  if shape == "square":
    return np.maximum(ax, ay) <= 0.8 * r
  if shape == "triangle":   # apex up, base at 0.75 r below the centre
    return (dy >= -r) & (dy <= 0.75 * r) & (ax <= 0.6 * (dy + r))
  if shape == "diamond":
    return ax + ay <= r
  if shape == "cross":
    return ((ax <= 0.3 * r) & (ay <= r)) | ((ay <= 0.3 * r) & (ax <= r))
  if shape == "ring":
    d2 = dx * dx + dy * dy
    return (d2 <= r * r) & (d2 >= (0.5 * r) ** 2)
  if shape == "bar":
    return (ax <= r) & (ay <= 0.35 * r)
  raise ValueError(f"unknown shape {shape!r}")


def _background(kind: str, size: int, rng: np.random.Generator) -> np.ndarray:
  x, y = _grid(size)
  noise = rng.normal(0.0, 1.0, (size, size, 1)).astype(np.float32)
  if kind == "grass":
    img = np.array([0.30, 0.55, 0.20]) + 0.08 * noise
  elif kind == "sand":
    img = np.array([0.86, 0.76, 0.52]) + 0.04 * noise
  elif kind == "sky":
    img = np.array([0.45, 0.65, 0.95]) + 0.25 * (y[..., None] - 0.5) * np.array([1.0, 0.8, 0.2])
  elif kind == "night":
    img = np.array([0.05, 0.07, 0.18]) + 0.9 * (rng.random((size, size, 1)) > 0.985)
  elif kind == "snow":
    img = np.array([0.90, 0.92, 0.96]) + 0.03 * noise
  elif kind == "brick":
    mortar = ((y * 8) % 1 < 0.12) | (((x * 4) + 0.5 * (np.floor(y * 8) % 2)) % 1 < 0.08)
    img = np.where(mortar[..., None], np.array([0.75, 0.72, 0.68]), np.array([0.62, 0.25, 0.18])) + 0.03 * noise
  else:
    raise ValueError(kind)
  return np.broadcast_to(img, (size, size, 3)).astype(np.float32)


def scene(scene_id: int) -> dict:
  """The description of one scene: background, the large object and one or two small ones, each
  {'shape', 'colour', 'cell', 'offset'} — drawn from PCG64([SEED, scene_id])."""
  rng = np.random.Generator(np.random.PCG64([SEED, int(scene_id)]))
  cells = rng.permutation(9)
  n_small = 1 + int(rng.random() < 0.3)
  objects = []
  for k in range(1 + n_small):
    cell = int(cells[k])
    objects.append(dict(shape=SHAPES[rng.integers(len(SHAPES))],
                        colour=COLOUR_NAMES[rng.integers(len(COLOUR_NAMES))],
                        cell=(cell // 3, cell % 3), offset=rng.uniform(-0.04, 0.04, 2), large=k == 0))
  return dict(background=BACKGROUNDS[rng.integers(len(BACKGROUNDS))], objects=objects,
              noise_seed=int(rng.integers(2 ** 31)))


def render(desc: dict, size: int) -> np.ndarray:
  """A scene as float32 RGB in [0, 1]: drawn at 2 x size, box-filtered to size."""
  big = 2 * size
  rng = np.random.Generator(np.random.PCG64(desc["noise_seed"]))
  img = _background(desc["background"], big, rng).copy()
  x, y = _grid(big)
  for obj in desc["objects"]:
    row, col = obj["cell"]
    cx, cy = (col + 0.5) / 3 + obj["offset"][0], (row + 0.5) / 3 + obj["offset"][1]
    r = 0.16 if obj["large"] else 0.085
    colour = np.asarray(COLOURS[obj["colour"]], np.float32)
    img[shape_mask(obj["shape"], x, y, cx, cy, r)] = colour
  img = img.reshape(size, 2, size, 2, 3).mean(axis=(1, 3))
  return np.clip(img, 0.0, 1.0)


def _object_phrase(obj: dict, rng: np.random.Generator) -> str:
  size = (_LARGE if obj["large"] else _SMALL)[rng.integers(3)]
  place = _PLACE[obj["cell"]][rng.integers(3)]
  return f"{size} {obj['colour']} {obj['shape']} {place}"


def caption(desc: dict, form: int, rng: np.random.Generator) -> str:
  """One description of the scene in caption form `form` (synonyms and object order drawn from rng)."""
  big = "a " + _object_phrase(desc["objects"][0], rng)
  smalls = [_object_phrase(o, rng) for o in desc["objects"][1:]]
  rng.shuffle(smalls)
  smalls = " and ".join(f"a {s}" for s in smalls)
  bg = _BACKGROUND_PHRASES[desc["background"]][rng.integers(3)]
  return _FORMS[form].format(big=big, smalls=smalls, bg=bg)


def zeroshot_templates() -> tuple[str, ...]:
  """Zero-shot prompts in the captions' style with everything but the class (the large object's colour)
  marginalised out: every size word with every shape — no per-image information."""
  return tuple(f"a {size} {{}} {shape}" for size, shape in itertools.product(_LARGE, SHAPES))


ZEROSHOT_TEMPLATES = zeroshot_templates()


@functools.lru_cache(maxsize=4)
def _rendered(split: str, image_size: int):
  n, offset = (NUM_TRAIN, 0) if split == "train" else (NUM_TEST, TEST_ID_OFFSET)
  ids = np.arange(n, dtype=np.int64) + offset
  descs = [scene(int(i)) for i in ids]
  pixels = np.stack([render(d, image_size) for d in descs])
  return ids, descs, pixels


def load(split: str, image_size: int = 24, captions_per_image: int | None = None) -> PairSplit:
  """The scenes split ('train' or 'test') as a PairSplit with images of shape (n, image_size, image_size, 3)."""
  if split not in ("train", "test"):
    raise ValueError(f"scenes has splits 'train' and 'test', not {split!r}")
  ids, descs, pixels = _rendered(split, int(image_size))
  k = captions_per_image or (1 if split == "train" else 2)
  captions, c2i = [], []
  for j, (i, desc) in enumerate(zip(ids, descs)):
    rng = np.random.Generator(np.random.PCG64([SEED, int(i), 1]))
    for form in rng.choice(len(_FORMS), size=k, replace=False):
      captions.append(caption(desc, int(form), rng))
      c2i.append(j)
  labels = np.asarray([CLASS_NAMES.index(d["objects"][0]["colour"]) for d in descs], np.int64)
  return PairSplit(images=((pixels - 0.5) / 0.5).astype(np.float32), captions=captions,
                   caption_to_image=np.asarray(c2i), image_labels=labels, image_ids=ids, class_names=CLASS_NAMES,
                   name=f"scenes/{split}")
