"""Tests run on 8 simulated CPU devices so that sharding is exercised without an accelerator.

NCJAX_TEST_ACCELERATOR=1 (benchmarks/accelerator/run.sh, on a GPU host): JAX's default backend is the accelerator,
so the tests that compute on `jax.devices()` run there; the `devices` fixture still gives the 8 simulated CPU
devices, whose sharding tests then run beside them. Run such a slice at JAX_DEFAULT_MATMUL_PRECISION=highest: a
GPU's default float32 matmul is TF32, ~1e-3 off the float32 references.
"""

import os

ACCELERATOR = os.environ.get("NCJAX_TEST_ACCELERATOR", "0") == "1"
if not ACCELERATOR:
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No persistent compilation cache: tests/shared_programs.py keeps each worker's programs in memory, and a disk cache
# in front of it would load every repeat from disk again (a new executable, new memory maps); with it, a step with
# FSDP all-gathers loaded from the cache hung in an earlier jaxlib's in-process collectives.
os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
# Reference computations (numpy, scikit-learn) on one BLAS thread: the workers already take every core, and two
# OpenBLAS threads per worker made scikit-learn's fits ~100x slower (the linear probe's: 39 s -> 0.3 s).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# The suite is compile-bound (tiny models, a few steps each), so it compiles for compile speed: LLVM's optimisation
# level 0 (~25% faster compiles) and XLA:CPU's older loop emitters instead of its MLIR fusion emitters (test_trainer.py
# 117 s -> 93-104 s); the programs still run in milliseconds. Inherited by the CLI subprocesses; benchmarks and real
# runs keep XLA's defaults. A flag already in XLA_FLAGS is left as the user set it.
# (jaxlib 0.11 has no loop emitters any more: ncjax.compat gives the flags the installed jaxlib accepts.)
from ncjax import compat  # noqa: E402

if not ACCELERATOR:   # (on a GPU the flags would slow the kernels under test, and its compiles are not the cost)
  os.environ["XLA_FLAGS"] = compat.with_xla_flags(os.environ.get("XLA_FLAGS", ""), compat.fast_compile_xla_flags())

from ncjax import runtime  # noqa: E402

runtime.configure_cpu_devices(8)

import jax  # noqa: E402

# NCJAX_TEST_REPORTED_BACKEND=gpu: JAX's default backend reported as that platform while computing on the CPU — how
# tests/test_accelerator_check.py checks that the GPU slice's tests hold whatever backend a host reports.
if os.environ.get("NCJAX_TEST_REPORTED_BACKEND"):
  jax.default_backend = lambda _reported=os.environ["NCJAX_TEST_REPORTED_BACKEND"]: _reported

import shared_programs  # noqa: E402  (tests/shared_programs.py: one compile per distinct program per worker)

shared_programs.install()

import absl.logging  # noqa: E402
import pytest  # noqa: E402

absl.logging.set_verbosity(absl.logging.WARNING)

# Directories of end-to-end runs (training, methods, the CLI); the rest are unit tests (`make test-unit`).
E2E_DIRS = ("methods", "train", "cli")


# The longest tests start first, so that the workers finish together (xdist hands tests out in collection order).
LONGEST_FIRST = ("test_chaos.py", "test_object_store.py", "test_multiprocess_evaluation.py", "test_accelerator_check.py",
                 "test_cli.py", "test_sweep_cli.py",
                 "test_eval_suite.py", "test_audit.py", "test_web_audit.py", "test_bad_inputs.py", "test_multihost.py", "test_pretrained_runs.py",
                 "test_concept_unlearning.py", "test_gsc_bayes_methods.py", "test_ncu_method.py")


def pytest_collection_modifyitems(config, items):
  for item in items:
    parts = item.path.relative_to(config.rootpath).parts
    if len(parts) > 2 and parts[1] in E2E_DIRS:
      item.add_marker(pytest.mark.e2e)
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture
def devices():
  cpus = jax.devices("cpu")
  assert len(cpus) == 8, "tests expect 8 simulated CPU devices (tests/conftest.py)"
  return cpus


@pytest.fixture(scope="session")
def built(tmp_path_factory):
  """Every builder built once from real-format fixtures (see tests/data_fixtures.py)."""
  import data_fixtures as fx
  from ncjax.data.tables import builders as tfds_builders
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
