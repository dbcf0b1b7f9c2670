"""Test helpers that do not configure JAX (safe to import from worker processes)."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(name: str, arg: str = ""):
  """configs/<name>.py:get_config(arg)."""
  from ncjax.config_lib import load_config_file
  return load_config_file(name, arg)


def make_config(name: str, arg: str = "", **overrides):
  """configs/<name>.py:<arg> for tests: no evaluators, quiet, synchronous checkpoints, then dotted-key overrides
  (`**{"optim.lr": 1e-3}`)."""
  cfg = load_config(name, arg)
  with cfg.unlocked():
    cfg.evals = {}
    cfg.log.progress = False
    cfg.ckpt.async_save = False
    for key, value in overrides.items():
      node = cfg
      *parents, leaf = key.split(".")
      for p in parents:
        node = node[p]
      node[leaf] = value
  return cfg


def tiny_clip_config(**kw):
  """A fast CLIP config on digits: tiny model, batch 64, two epochs, 40% noise."""
  return make_config("clip", kw.pop("arg", "noise=0.4,batch=64,epochs=2"), **kw)
