"""Test helpers that do not configure JAX (safe to import from worker processes)."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(name: str, arg: str = ""):
  """configs/<name>.py:get_config(arg), unlocked copy for tests to adjust."""
  import importlib.util
  spec = importlib.util.spec_from_file_location(f"configs_{name}", os.path.join(ROOT, "configs", f"{name}.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config(arg)


def tiny_clip_config(**kw):
  """A fast CLIP config on digits: tiny model, small batch, no evaluators, quiet logs."""
  cfg = load_config("clip", kw.pop("arg", "noise=0.4,batch=64,epochs=2"))
  with cfg.unlocked():
    cfg.evals = {}
    cfg.log.progress = False
    cfg.ckpt.async_save = False
    for key, value in kw.items():
      node = cfg
      *parents, leaf = key.split(".")
      for p in parents:
        node = node[p]
      node[leaf] = value
  return cfg
