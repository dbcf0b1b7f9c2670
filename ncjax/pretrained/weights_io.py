"""Reading and writing flat {name: array} checkpoints: safetensors (no torch needed, bf16 included) and PyTorch's
.pt / .bin / .pth files (state dicts, training checkpoints and OpenAI's TorchScript archives; these need torch,
`pip install 'ncjax[torch]'`). Every array comes back as a host numpy array; half-precision weights are widened to
float32.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile

import numpy as np

from ncjax import errors

SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32, "I16": np.int16,
    "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl")


class CheckpointFormatError(errors.CheckpointError):
  """A checkpoint file that cannot be read as what it claims to be (truncated, wrong format, unknown dtype)."""


def _dtype(name: str, path: str):
  if name == "BF16":
    import ml_dtypes
    return ml_dtypes.bfloat16
  if name not in SAFETENSORS_DTYPES:
    raise CheckpointFormatError(f"{path}: unsupported safetensors dtype {name!r}")
  return SAFETENSORS_DTYPES[name]


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """All tensors of a .safetensors file (header parsed here so that bf16 and truncation get clear errors)."""
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise CheckpointFormatError(f"{path} is not a safetensors file (shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", head)
    if n <= 0 or 8 + n > size:
      raise CheckpointFormatError(f"{path} is not a safetensors file or is truncated (header of {n} bytes, "
                                  f"file of {size})")
    try:
      header = json.loads(f.read(n))
    except ValueError as e:
      raise CheckpointFormatError(f"{path}: unreadable safetensors header ({e})") from None
    data = f.read()
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    start, end = info["data_offsets"]
    if end > len(data):
      raise CheckpointFormatError(f"{path} is truncated: tensor {name!r} ends at byte {end} of a "
                                  f"{len(data)}-byte buffer")
    arr = np.frombuffer(data[start:end], dtype=_dtype(info["dtype"], path)).reshape(info["shape"])
    out[name] = _widen(arr)
  return out


def _widen(arr: np.ndarray) -> np.ndarray:
  if arr.dtype == np.float16 or arr.dtype.name == "bfloat16":
    return arr.astype(np.float32)
  return np.array(arr)


def write_safetensors(path: str, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
  """Write float32 / integer arrays as a .safetensors file (written to a temporary name, then renamed)."""
  from safetensors.numpy import save_file
  tmp = path + ".tmp"
  save_file({k: np.asarray(v, order="C") for k, v in tensors.items()}, tmp, metadata=metadata)
  os.replace(tmp, path)


def _require_torch(path: str):
  try:
    import torch
  except ImportError:
    raise errors.MissingDependency(f"reading {path} (a PyTorch checkpoint) needs torch: pip install "
                                   f"'ncjax[torch]' (a CPU build is enough), or convert the file to .safetensors"
                                   ) from None
  return torch


def is_torchscript(path: str) -> bool:
  """OpenAI's released CLIP .pt files are TorchScript archives (zip files holding code/ and constants.pkl)."""
  if not zipfile.is_zipfile(path):
    return False
  with zipfile.ZipFile(path) as z:
    names = z.namelist()
  return any(n.endswith("constants.pkl") for n in names) or any("/code/" in n for n in names)


def read_torch(path: str) -> dict:
  """The state dict of a PyTorch file: a TorchScript archive, a state dict, or a training checkpoint holding one
  under 'state_dict' / 'model' (DDP's 'module.' prefixes stripped). Non-tensor entries are kept as they are."""
  torch = _require_torch(path)
  try:
    if is_torchscript(path):
      obj = torch.jit.load(path, map_location="cpu").state_dict()
    else:
      obj = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:  # truncated zip, pickle errors, ...
    first = str(e).split(". ")[0].splitlines()[0][:160] if str(e) else ""   # torch's reasons run to a paragraph
    raise CheckpointFormatError(f"{path}: not a readable PyTorch checkpoint ({type(e).__name__}: {first}): a "
                                f"truncated or corrupt download, or not a PyTorch file") from None
  if isinstance(obj, dict):
    for key in ("state_dict", "model", "module"):
      if key in obj and isinstance(obj[key], dict):
        obj = obj[key]
        break
  if not isinstance(obj, dict):
    raise CheckpointFormatError(f"{path} holds a {type(obj).__name__}, not a state dict")
  out = {}
  for k, v in obj.items():
    k = k[len("module."):] if k.startswith("module.") else k
    out[k] = _widen(v.detach().float().numpy() if v.is_floating_point() else v.detach().numpy()) \
        if hasattr(v, "detach") else v
  return out


def read_tensors(path: str) -> dict:
  """{name: array} of a checkpoint file, by its extension (.safetensors, or a PyTorch file)."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"checkpoint file not found: {path}")
  if os.path.isdir(path):
    raise IsADirectoryError(f"{path} is a directory; expected a checkpoint file (.safetensors, .pt, .bin, .pth)")
  if path.endswith(".safetensors"):
    return read_safetensors(path)
  if path.endswith(TORCH_SUFFIXES) or zipfile.is_zipfile(path):
    return read_torch(path)
  raise CheckpointFormatError(f"{path}: unknown checkpoint format (expected .safetensors, {', '.join(TORCH_SUFFIXES)})")
