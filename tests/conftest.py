"""Tests run on 8 simulated CPU devices so that sharding is exercised without an accelerator."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Tests compile many identical programs (the same tiny model, batch and mesh in different tests, workers and
# subprocesses): JAX's persistent compilation cache turns every repeat into a load. Shared by the xdist workers and
# inherited by CLI subprocesses through the environment; kept between local runs under .pytest_cache/.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_ROOT, ".pytest_cache", "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

from ncjax import runtime  # noqa: E402

runtime.configure_cpu_devices(8)

import jax  # noqa: E402

import absl.logging  # noqa: E402
import pytest  # noqa: E402

absl.logging.set_verbosity(absl.logging.WARNING)

# Directories of end-to-end runs (training, methods, the CLI); the rest are unit tests (`make test-unit`).
E2E_DIRS = ("methods", "train", "cli")


def pytest_collection_modifyitems(config, items):
  for item in items:
    parts = item.path.relative_to(config.rootpath).parts
    if len(parts) > 2 and parts[1] in E2E_DIRS:
      item.add_marker(pytest.mark.e2e)


@pytest.fixture
def devices():
  assert len(jax.devices()) == 8, "tests expect 8 simulated CPU devices (tests/conftest.py)"
  return jax.devices()


@pytest.fixture(scope="session")
def built(tmp_path_factory):
  """Every builder built once from real-format fixtures (see tests/data_fixtures.py)."""
  import data_fixtures as fx
  from ncjax.data import tfds_builders
  root = tmp_path_factory.mktemp("datasets")
  data_dir = str(root / "tfds")
  wds_caps = fx.write_webdataset(str(root / "wds"))
  tfds_builders.build("web_pairs", "redcaps", str(root / "wds"), data_dir)
  fx.write_karpathy(str(root / "f30k"))
  tfds_builders.build("karpathy", "flickr30k", str(root / "f30k"), data_dir)
  fx.write_precomp(str(root / "precomp"))
  tfds_builders.build("precomp", "f30k_precomp", str(root / "precomp"), data_dir)
  fx.write_precomp(str(root / "cc152k"), tsv=True)
  tfds_builders.build("precomp", "cc152k_precomp", str(root / "cc152k"), data_dir)
  tfds_builders.build("digits", None, None, data_dir)
  return dict(root=root, data_dir=data_dir, wds_caps=wds_caps)
