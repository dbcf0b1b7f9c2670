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


# methods.md §1.7: NCU's numerical cross-check. Its expected values come from an independent float64 numpy
# restatement of hhc1997/NCU's src/ul_clip.py written for the notes, not from ncjax (tests/README.md): at P = 0.25
# the forget set is {2, 5}, the Sinkhorn solves stop after 81 (image side) and 91 (text side) iterations, and
# L_img = 2.677844, L_txt = 2.364622, L_ul = 2.521233, L_opp' = 0.216589.
NCU_CROSSCHECK = dict(ratio=0.25, forget=(2, 5), iterations=(81, 91), loss_img=2.677844, loss_txt=2.364622,
                      loss_ul=2.521233, loss_band=0.216589)


def ncu_crosscheck_inputs(dtype="float32"):
  """methods.md §1.7's N = 8, D = 4 inputs from their closed formulas, each row L2-normalised: images V, texts T
  (rows 2 and 5 replaced: the noisy pairs) and negative texts T^- (built from the un-normalised T)."""
  import numpy as np
  i, d = np.arange(8)[:, None], np.arange(4)[None, :]
  v = np.cos(0.5 * i * d + i + 0.3 * d)
  t = v + 0.3 * np.sin(1.7 * i + d)
  for r in (2, 5):
    t[r] = np.cos(0.9 * r * np.arange(4) + 2.0)
  tn = -t + 0.5 * np.cos(i + 2 * d)
  unit = lambda x: (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(dtype)
  return unit(v), unit(t), unit(tn)
