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
# The processes a test starts (the CLI runs, chaos, the GCS runs) share one persistent compilation cache per test
# session: a killed run's restart, a resumed run and the reference run compile the same programs (the chaos test's
# 6 runs: 114 s -> 91 s alone). The session's first process (xdist's controller, or a plain pytest) makes it empty
# and removes it at the end (pytest_unconfigure); the workers inherit it. JAX in the test processes themselves
# keeps it off (jax.config below): tests/shared_programs.py keeps each worker's programs in memory, and a disk
# cache in front of it would load every repeat from disk again (a new executable, new memory maps). Processes of a
# multi-process job get no cache (tests/multiprocess.py): only single processes were checked with it (an FSDP step
# loaded from the cache once hung in an earlier jaxlib; on jaxlib 0.10.2 test_fsdp_mesh_matches_data_parallel
# passes from it). A cache named in NCJAX_TEST_XLA_CACHE beforehand is used and kept.
_OWNS_SUBPROCESS_CACHE = False
if not ACCELERATOR:
  if not os.environ.get("NCJAX_TEST_XLA_CACHE"):
    import tempfile
    os.environ["NCJAX_TEST_XLA_CACHE"] = tempfile.mkdtemp(prefix="ncjax_test_xla_cache_")
    _OWNS_SUBPROCESS_CACHE = True
  # A size limit, because only a limited cache takes its file lock: unlimited, JAX writes an entry in place, and a
  # process reading it meanwhile from the other worker's test gets a cut-off entry (a warning on its stderr).
  os.environ.update(JAX_ENABLE_COMPILATION_CACHE="true", JAX_COMPILATION_CACHE_DIR=os.environ["NCJAX_TEST_XLA_CACHE"],
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
                    JAX_COMPILATION_CACHE_MAX_SIZE=str(8 << 30))
else:
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

jax.config.update("jax_enable_compilation_cache", False)   # in this process: the in-memory cache (above)

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
LONGEST_FIRST = ("test_accelerator_check.py", "test_multiprocess_evaluation.py", "test_object_store.py", "test_chaos.py",
                 "test_ncu_method.py", "test_own_data.py", "test_cli.py", "test_sweep_cli.py", "test_eval_suite.py",
                 "test_audit.py", "test_web_audit.py", "test_bad_inputs.py", "test_multihost.py",
                 "test_pretrained_runs.py", "test_concept_unlearning.py", "test_gsc_bayes_methods.py")


def pytest_collection_modifyitems(config, items):
  for item in items:
    parts = item.path.relative_to(config.rootpath).parts
    if len(parts) > 2 and parts[1] in E2E_DIRS:
      item.add_marker(pytest.mark.e2e)
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def pytest_collection_finish(session):
  # Python's cyclic collector rescanned every module, test and cached program the worker holds at each full
  # collection: ~6% of a trainer test file's time (4 s of 65 s on test_trainer.py). What collection imported is
  # frozen out of its scans, and collections run less often (tracing allocates millions of short-lived objects; the
  # first generation's threshold of 700 collected ~35 times a second): the collector's time there fell to ~1.2 s.
  import gc
  gc.freeze()
  gc.set_threshold(10_000, 20, 20)


def pytest_unconfigure(config):
  if _OWNS_SUBPROCESS_CACHE:
    import shutil
    shutil.rmtree(os.environ["NCJAX_TEST_XLA_CACHE"], ignore_errors=True)


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
