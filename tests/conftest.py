"""Tests run on 8 simulated CPU devices so that sharding is exercised without an accelerator."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import absl.logging  # noqa: E402
import pytest  # noqa: E402

absl.logging.set_verbosity(absl.logging.WARNING)

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


@pytest.fixture
def devices():
  assert len(jax.devices()) == 8, "tests expect 8 simulated CPU devices (tests/conftest.py)"
  return jax.devices()
