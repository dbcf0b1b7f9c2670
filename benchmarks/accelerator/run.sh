#!/usr/bin/env bash
# The accelerator check, on a GPU host without network: install the wheels its image lacks (.whl/, made by
# wheels.sh where PyPI is reachable), print the card and the versions, run the GPU slice of the test suite under a
# time limit, then the measurements of benchmarks/accelerator/bench.py under what is left of the time.
#
#   bash benchmarks/accelerator/run.sh [--smoke] [--out DIR] [--total_s S] [--tests_s S] [--budget_s S]
#                                      [--sections a,b,c,d,e]
#
#   --smoke      the same measurements at tiny sizes on the CPU: no install, no test slice
#                (what tests/test_accelerator_check.py runs)
#   --out DIR    where the table, the JSON and the logs go (default: $OUT, the device tool's output folder, else
#                bench_results/accelerator)
#   --total_s    wall time of the whole check (default 450: the GPU session's 8 minutes, less its start and copies)
#   --tests_s    time limit of the test slice (default 150; 0 skips it); its counts are kept even when it is stopped
#   --budget_s   time budget of the measurements (default: what --total_s leaves, at most 360)
#   --sections   which measurements (bench.py's sections; default all, in priority order)
#
# The interpreter is $PYTHON, else python3 from PATH. The repository is put on PYTHONPATH (nothing is installed
# into the image's site-packages); the wheels go to /tmp/site without their dependencies.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
SMOKE=0
OUT_DIR=${OUT:-}
TOTAL_S=450
TESTS_S=150
BUDGET_S=
SECTIONS=a,b,c,d,e
while (( $# )); do
  case $1 in
    --smoke) SMOKE=1 ;;
    --out) OUT_DIR=$2; shift ;;
    --total_s) TOTAL_S=$2; shift ;;
    --tests_s) TESTS_S=$2; shift ;;
    --budget_s) BUDGET_S=$2; shift ;;
    --sections) SECTIONS=$2; shift ;;
    *) echo "run.sh: unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
  shift
done
OUT_DIR=${OUT_DIR:-bench_results/accelerator}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
PY=${PYTHON:-python3}
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START )); }

if (( ! SMOKE )) && compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --upgrade \
    --target /tmp/site .whl/*.whl \
    || echo "run.sh: installing .whl/ failed; going on with what the image has" >&2
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT_DIR/nvidia_smi.csv"
fi
"$PY" - <<'PYEOF'
import sys
from importlib import metadata
found = []
for name in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax", "orbax-checkpoint", "numpy",
             "torch", "open_clip_torch", "ott-jax", "grain", "tensorflow-datasets"):
  try:
    found.append(f"{name} {metadata.version(name)}")
  except metadata.PackageNotFoundError:
    found.append(f"{name} -")
print(f"python {sys.version.split()[0]}; " + ", ".join(found), flush=True)
PYEOF

if (( ! SMOKE )) && (( TESTS_S > 0 )); then
  echo "== GPU slice of the test suite (at most ${TESTS_S} s)"
  rm -f "$OUT_DIR/tests.jsonl"
  t0=$(date +%s)
  # The slice's JAX default backend is the GPU (tests/conftest.py); float32 matmuls at full precision, as the
  # tests' references are (a GPU's default is TF32).
  NCJAX_TEST_ACCELERATOR=1 JAX_DEFAULT_MATMUL_PRECISION=highest NCJAX_TEST_SHARE_PROGRAMS=0 \
  NCJAX_PYTEST_COUNTS="$OUT_DIR/tests.jsonl" \
    timeout --kill-after=10 "$TESTS_S" "$PY" -m pytest -q -p no:cacheprovider \
      -p benchmarks.accelerator.pytest_counts tests/losses tests/ot tests/samplers tests/models/test_models.py \
      tests/models/test_attention.py tests/test_checkpoint.py \
      tests/train/test_trainer.py::test_sharded_step_equals_single_device_step > "$OUT_DIR/tests.log" 2>&1
  rc=$?
  tail -n 25 "$OUT_DIR/tests.log"
  timed_out=false
  if (( rc == 124 || rc == 137 )); then timed_out=true; echo "run.sh: the test slice was stopped at ${TESTS_S} s"; fi
  printf '{"rc": %d, "timed_out": %s, "seconds": %d, "limit_s": %d}\n' "$rc" "$timed_out" $(( $(date +%s) - t0 )) \
    "$TESTS_S" > "$OUT_DIR/tests_meta.json"
else
  rm -f "$OUT_DIR/tests_meta.json" "$OUT_DIR/tests.jsonl"
fi

if [[ -z $BUDGET_S ]]; then
  # What is left of the total, less the bench's grace for a worker overrunning the deadline and the table's writing.
  BUDGET_S=$(( TOTAL_S - $(elapsed) - 30 ))
  if (( BUDGET_S > 360 )); then BUDGET_S=360; fi
  if (( SMOKE )); then BUDGET_S=120; fi
fi
echo "== measurements (budget ${BUDGET_S} s, $(elapsed) s spent)"
"$PY" -m benchmarks.accelerator.bench --out "$OUT_DIR" --budget_s "$BUDGET_S" --sections "$SECTIONS" \
  $( (( SMOKE )) && echo --smoke )
rc=$?
echo "run.sh: done in $(elapsed) s; $OUT_DIR/accelerator.md"
exit $rc
