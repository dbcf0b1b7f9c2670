"""Helpers for tests and benchmarks that compare ncjax against reference implementations (never imported by the
library itself).

open_clip is installed without its torchvision / timm requirements (setup.cfg's [test] extra and the Makefile): its
models and tokenizer need neither, and PyPI's torchvision does not load beside a CPU build of torch.
`import_open_clip` therefore lends open_clip's import a stand-in `torchvision` module (only names referenced by its
image-transform code, which parity tests and benchmarks never call) and removes it afterwards.
"""

import importlib
import importlib.machinery
import sys
import types


class _AnyMeta(type):
  def __getattr__(cls, name):
    if name.startswith("__"):
      raise AttributeError(name)
    return _Placeholder


class _Placeholder(metaclass=_AnyMeta):
  def __init__(self, *args, **kwargs):
    pass


class _AnyModule(types.ModuleType):
  def __getattr__(self, name):
    if name.startswith("__"):
      raise AttributeError(name)
    return _Placeholder


def import_open_clip():
  if "open_clip" in sys.modules:
    return sys.modules["open_clip"]
  try:
    import torchvision  # noqa: F401
    return importlib.import_module("open_clip")
  except ImportError:
    pass
  try:  # transformers caches whether torchvision exists: record its absence before the stand-in appears
    from transformers.utils import import_utils
    import_utils.is_torchvision_available()
  except ImportError:
    pass
  names = ["torchvision", "torchvision.transforms", "torchvision.transforms.functional", "torchvision.ops",
           "torchvision.ops.misc"]
  saved = {n: sys.modules.get(n) for n in names}
  for n in names:
    sys.modules[n] = _AnyModule(n)
    sys.modules[n].__spec__ = importlib.machinery.ModuleSpec(n, None)
  for n in names:
    parent, _, child = n.rpartition(".")
    if parent:
      setattr(sys.modules[parent], child, sys.modules[n])
  try:
    return importlib.import_module("open_clip")
  finally:
    for n, m in saved.items():
      if m is None:
        sys.modules.pop(n, None)
      else:
        sys.modules[n] = m
