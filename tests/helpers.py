"""Test helpers that do not configure JAX (safe to import from worker processes)."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(name: str, arg: str = ""):
  """configs/<name>.py:get_config(arg)."""
  from ncjax.config_lib import load_config_file
  return load_config_file(name, arg)


# The suite's two-tower model: `micro`, the configs' `tiny` with one block per tower (ncjax/models/sizes.py). The
# suite is compile-bound and XLA compiles the blocks unrolled: a step compiles in about half tiny's time. A test
# that needs a second block (freezing one of them) asks for it: `model.text_depth=2`, or `model.size="tiny"`.
TEST_MODEL = "micro"


def make_config(name: str, arg: str = "", **overrides):
  """configs/<name>.py:<arg> for tests: the `micro` model where the config says `tiny`, no evaluators, quiet,
  synchronous checkpoints, then dotted-key overrides (`**{"optim.lr": 1e-3}`)."""
  cfg = load_config(name, arg)
  with cfg.unlocked():
    if cfg.model.size == "tiny":
      cfg.model.size = TEST_MODEL
    if not cfg.method.init_from and _needs_trained_start(cfg.method.name):
      cfg.method.init_from = "random"   # the tests train unlearning methods from random weights on purpose
    cfg.evals = {}
    cfg.log.progress = False
    cfg.ckpt.async_save = False
  return override(cfg, **overrides)


def _needs_trained_start(method: str) -> bool:
  from ncjax.methods import method_class
  return bool(method_class(method).needs_trained_start)


def override(cfg, **overrides):
  """Set dotted keys (`**{"optim.lr": 1e-3}`) in place, as `--config.optim.lr=1e-3` would; returns cfg."""
  from ncjax import config_lib
  return config_lib.set_dotted(cfg, overrides)


def tiny_clip_config(**kw):
  """A fast CLIP config on digits: micro model, batch 64, two epochs, 40% noise."""
  return make_config("clip", kw.pop("arg", "noise=0.4,batch=64,epochs=2"), **kw)


def host_params(result):
  """A train result's parameters as host numpy arrays."""
  import jax
  import numpy as np
  return jax.tree.map(np.asarray, jax.device_get(result.params))


def leaves(tree) -> dict:
  """{'/'-joined path: host array} of a pytree (device arrays fetched)."""
  import jax
  import numpy as np
  return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
          for path, v in jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]}


def assert_trees_equal(a, b, exact=True, atol=0.0):
  """Same structure and leaves: bitwise (exact) or within atol."""
  import jax
  import numpy as np
  a, b = jax.device_get(a), jax.device_get(b)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    if exact:
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    else:
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=0)


def changed(before, after) -> list[bool]:
  """Per leaf: did it change?"""
  import jax
  import numpy as np
  return [not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after))]


def stopped_at(workdir, step: int, dest) -> str:
  """A copy of a finished run's workdir holding only its checkpoints up to `step` (the run saved there with
  `ckpt.every_steps`): what the same run stopped after saving step `step` leaves behind (killed, preempted,
  `--until_step`). Resuming the copy must end bitwise where the uninterrupted run ended; the copy costs no second
  run up to `step`."""
  import shutil
  shutil.copytree(workdir, dest)
  checkpoints = os.path.join(dest, "checkpoints")
  for name in os.listdir(checkpoints):
    if name.isdigit() and int(name) > step:
      shutil.rmtree(os.path.join(checkpoints, name))
  assert sorted(int(n) for n in os.listdir(checkpoints) if n.isdigit())[-1] == step, os.listdir(checkpoints)
  return str(dest)
