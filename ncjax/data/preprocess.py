"""Image preprocessing matching CLIP evaluation, and training augmentation.

Evaluation (open_clip / CLIP_benchmark): resize the shortest side to `size` with bicubic interpolation (PIL, which
antialiases when downsampling, like torchvision's PIL path), centre crop `size` x `size` (torchvision's rounding),
scale to [0, 1], normalise with the model's mean/std. Training: random resized crop (scale and aspect-ratio ranges
as torchvision's RandomResizedCrop, open_clip's default scale (0.9, 1.0)), bicubic, same normalisation. Randomness
comes from an explicit numpy Generator so a (seed, step, position) reproduces the crop exactly.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

NORMALIZATION = {
    "openai": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),   # MERU
    "siglip": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),                 # big_vision / SigLIP: [-1, 1]
}


def _to_pil(image) -> Image.Image:
  if isinstance(image, Image.Image):
    return image.convert("RGB")
  arr = np.asarray(image)
  if arr.ndim == 2:
    arr = np.repeat(arr[..., None], 3, axis=-1)
  return Image.fromarray(arr.astype(np.uint8)).convert("RGB")


def normalization_constants(normalization: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """(mean, std) of a named normalisation, or of 'custom:m0,m1,m2/s0,s1,s2' (what imported models carry)."""
  if normalization in NORMALIZATION:
    return NORMALIZATION[normalization]
  if normalization.startswith("custom:"):
    try:
      mean, std = normalization[len("custom:"):].split("/")
      mean, std = tuple(float(x) for x in mean.split(",")), tuple(float(x) for x in std.split(","))
    except ValueError:
      mean = std = ()
    if len(mean) == 3 and len(std) == 3:
      return mean, std
  raise ValueError(f"unknown normalisation {normalization!r}; known: {sorted(NORMALIZATION)} or "
                   f"'custom:m0,m1,m2/s0,s1,s2'")


def normalize(pixels_uint8: np.ndarray, normalization: str = "openai") -> np.ndarray:
  mean, std = normalization_constants(normalization)
  x = pixels_uint8.astype(np.float32) / 255.0
  return (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)


def resize_shortest_side(img: Image.Image, size: int) -> Image.Image:
  w, h = img.size
  if min(w, h) == size:
    return img
  if w <= h:
    new_w, new_h = size, int(size * h / w)
  else:
    new_w, new_h = int(size * w / h), size
  return img.resize((new_w, new_h), Image.BICUBIC)


def center_crop(img: Image.Image, size: int) -> Image.Image:
  w, h = img.size
  top = int(round((h - size) / 2.0))
  left = int(round((w - size) / 2.0))
  return img.crop((left, top, left + size, top + size))


RESIZE_MODES = ("shortest", "squash")


def eval_transform(image, size: int, normalization: str = "openai", resize: str = "shortest") -> np.ndarray:
  """CLIP's evaluation transform -> float32 (size, size, 3): 'shortest' resizes the shortest side then centre-crops
  (CLIP, open_clip; MERU's classification), 'squash' resizes to size x size (MERU's retrieval)."""
  img = _to_pil(image)
  if resize == "shortest":
    img = center_crop(resize_shortest_side(img, size), size)
  elif resize == "squash":
    img = img.resize((size, size), Image.BICUBIC)
  else:
    raise ValueError(f"unknown resize mode {resize!r}; expected one of {RESIZE_MODES}")
  return normalize(np.asarray(img), normalization)


def random_resized_crop_box(rng: np.random.Generator, width: int, height: int, scale=(0.9, 1.0),
                            ratio=(3 / 4, 4 / 3)):
  """torchvision's RandomResizedCrop.get_params: (left, top, w, h); falls back to a centre crop."""
  area = width * height
  log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
  for _ in range(10):
    target = area * rng.uniform(scale[0], scale[1])
    aspect = math.exp(rng.uniform(*log_ratio))
    w = int(round(math.sqrt(target * aspect)))
    h = int(round(math.sqrt(target / aspect)))
    if 0 < w <= width and 0 < h <= height:
      return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h
  in_ratio = width / height
  if in_ratio < ratio[0]:
    w, h = width, int(round(width / ratio[0]))
  elif in_ratio > ratio[1]:
    h, w = height, int(round(height * ratio[1]))
  else:
    w, h = width, height
  return (width - w) // 2, (height - h) // 2, w, h


def _bilinear_matrix(out_size: int, start, length, in_size: int) -> np.ndarray:
  """(..., out_size, in_size) weights resampling the window [start, start + length) of an axis to out_size samples
  (bilinear, pixel centres aligned as PIL/torchvision; edge samples clamped); `start`, `length`: scalars or arrays."""
  start, length = np.asarray(start, np.float64)[..., None], np.asarray(length, np.float64)[..., None]
  centres = np.clip(start + (np.arange(out_size) + 0.5) * (length / out_size) - 0.5, 0.0, in_size - 1.0)
  lo = np.floor(centres).astype(np.int64)
  hi = np.minimum(lo + 1, in_size - 1)
  frac = (centres - lo).astype(np.float32)
  grid = np.arange(in_size)
  # where lo == hi (the clamped edge) the two weights add up to 1
  return ((grid == lo[..., None]) * (1.0 - frac)[..., None] + (grid == hi[..., None]) * frac[..., None]
          ).astype(np.float32)


def random_resized_crop_arrays(images: np.ndarray, rngs, scale=(0.9, 1.0)) -> np.ndarray:
  """RandomResizedCrop on images that are already model-ready (B, H, W, C) float arrays (the in-memory datasets:
  digits, synthetic), one generator per image: the same box distribution as `train_transform`, resampled back to
  (H, W) bilinearly — two batched matrix products."""
  images = np.asarray(images)
  b, h_in, w_in, _ = images.shape
  boxes = np.asarray([random_resized_crop_box(rng, w_in, h_in, scale) for rng in rngs]).reshape(b, 4)
  rows = _bilinear_matrix(h_in, boxes[:, 1], boxes[:, 3], h_in)           # (B, H, H)
  cols = _bilinear_matrix(w_in, boxes[:, 0], boxes[:, 2], w_in)           # (B, W, W)
  chw = np.moveaxis(images.astype(np.float32), -1, 1)                      # (B, C, H, W)
  out = rows[:, None] @ chw @ np.swapaxes(cols, 1, 2)[:, None]
  return np.moveaxis(out, 1, -1).astype(images.dtype)


def train_transform(image, size: int, rng: np.random.Generator, normalization: str = "openai",
                    scale=(0.9, 1.0)) -> np.ndarray:
  img = _to_pil(image)
  left, top, w, h = random_resized_crop_box(rng, img.size[0], img.size[1], scale)
  img = img.resize((size, size), Image.BICUBIC, box=(left, top, left + w, top + h))
  return normalize(np.asarray(img), normalization)
