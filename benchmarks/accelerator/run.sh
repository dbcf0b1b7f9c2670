#!/usr/bin/env bash
# The accelerator check, on a GPU host without network, in one call: install the wheels its image lacks (.whl/,
# made by wheels.sh where PyPI is reachable), print the card and the versions, run the measurements of
# benchmarks/accelerator/bench.py by its plan (plan.py), then the GPU slice of the test suite in what is left.
#
#   bash benchmarks/accelerator/run.sh [--plan] [--smoke] [--out DIR] [--total_s S] [--sections a,b,c,d,e]
#
#   --plan       print the plan (each worker's preparation and turn, the tests' share, what is left out) and stop
#   --smoke      the same plan at tiny sizes on the CPU: no install, no test slice (tests/test_accelerator_check.py)
#   --out DIR    where the table, the JSON, the rows and the logs' archive go (default: $OUT, the device tool's
#                output folder, else bench_results/accelerator); it holds those four files and nothing else
#   --total_s    wall time of the whole check (default 570: inside a device call's 600 s command limit)
#   --sections   which measurements (bench.py's sections; default all, in priority order)
#   --calibrate F  with --plan: plan with the phase times of an earlier run's accelerator.json
#
# The interpreter is $PYTHON, else python3 from PATH; it must import jax. The repository is put on PYTHONPATH
# (nothing is installed into the image's site-packages); the wheels go to /tmp/site without their dependencies.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
SMOKE=0
PLAN=0
OUT_DIR=${OUT:-}
TOTAL_S=570
SECTIONS=a,b,c,d,e
CALIBRATE=
while (( $# )); do
  case $1 in
    --plan) PLAN=1 ;;
    --smoke) SMOKE=1 ;;
    --out) OUT_DIR=$2; shift ;;
    --total_s) TOTAL_S=$2; shift ;;
    --sections) SECTIONS=$2; shift ;;
    --calibrate) CALIBRATE=$2; shift ;;
    *) echo "run.sh: unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
  shift
done
PY=${PYTHON:-python3}
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START )); }
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
BENCH=("$PY" -m benchmarks.accelerator.bench)
SMOKE_ARG=()
(( SMOKE )) && SMOKE_ARG=(--smoke)

if (( PLAN )); then   # pure Python: no jax needed to plan
  exec "${BENCH[@]}" --plan --total_s "$TOTAL_S" --sections "$SECTIONS" "${SMOKE_ARG[@]}" \
    ${CALIBRATE:+--calibrate "$CALIBRATE"}
fi

if ! "$PY" -c 'import jax' >/dev/null 2>&1; then
  echo "run.sh: $PY ($(command -v "$PY" || echo 'not found')) cannot import jax; name the interpreter that can:" \
       "PYTHON=/path/to/python3 bash $0" >&2
  exit 2
fi
if (( ! SMOKE )) && compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --upgrade \
    --target /tmp/site .whl/*.whl \
    || echo "run.sh: installing .whl/ failed; going on with what the image has" >&2
  # after the repository, before the image's own site-packages: the wheels only add what the image lacks
  export PYTHONPATH=$REPO:/tmp/site
fi

OUT_DIR=${OUT_DIR:-bench_results/accelerator}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/ncjax_accelerator_logs.XXXXXX")
rm -f "$OUT_DIR"/accelerator.md "$OUT_DIR"/accelerator.json "$OUT_DIR"/rows.jsonl "$OUT_DIR"/logs.tar.gz

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$LOGS/nvidia_smi.csv"
fi
"$PY" - <<'PYEOF' | tee "$LOGS/versions.txt"
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

# The measurements first: the plan's share of the total, less the tests' minimum and the table's writing.
read -r MEASURE_S TESTS_MIN_S FINALIZE_S < <("$PY" - "$TOTAL_S" "$(elapsed)" "$SECTIONS" "$SMOKE" <<'PYEOF'
import sys
from benchmarks.accelerator import plan
total, spent, sections, smoke = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3].split(","), sys.argv[4] == "1"
p = plan.schedule(total, smoke=smoke, sections=sections)
print(int(total - spent - p["tests_min_s"] - p["finalize_s"]), int(p["tests_min_s"]), int(p["finalize_s"]))
PYEOF
)
echo "== measurements (at most ${MEASURE_S} s, $(elapsed) s spent)"
"${BENCH[@]}" --out "$OUT_DIR" --logs "$LOGS" --measure_s "$MEASURE_S" --sections "$SECTIONS" "${SMOKE_ARG[@]}"

if (( ! SMOKE )); then
  TESTS_S=$(( TOTAL_S - $(elapsed) - FINALIZE_S ))
  if (( TESTS_S < 10 )); then
    echo "run.sh: no time is left for the test slice"
  else
    echo "== GPU slice of the test suite (at most ${TESTS_S} s; its minimum first)"
    t0=$(date +%s)
    # The slice's JAX default backend is the GPU (tests/conftest.py); float32 matmuls at full precision, as the
    # tests' references are (a GPU's default is TF32). The minimum slice runs first: pytest runs the files in the
    # order given. Four pytest workers share the card, none taking 75% of it at start.
    NCJAX_TEST_ACCELERATOR=1 JAX_DEFAULT_MATMUL_PRECISION=highest NCJAX_TEST_SHARE_PROGRAMS=0 \
    XLA_PYTHON_CLIENT_PREALLOCATE=false NCJAX_PYTEST_COUNTS="$LOGS/tests.jsonl" \
      timeout --kill-after=10 "$TESTS_S" "$PY" -m pytest -q -p no:cacheprovider -n 4 --dist loadfile \
        -p benchmarks.accelerator.pytest_counts tests/losses tests/ot tests/samplers \
        tests/train/test_trainer.py::test_sharded_step_equals_single_device_step \
        tests/models/test_models.py tests/models/test_attention.py tests/test_checkpoint.py > "$LOGS/tests.log" 2>&1
    rc=$?
    tail -n 15 "$LOGS/tests.log"
    timed_out=false
    if (( rc == 124 || rc == 137 )); then timed_out=true; echo "run.sh: the test slice was stopped at ${TESTS_S} s"; fi
    printf '{"rc": %d, "timed_out": %s, "seconds": %d, "limit_s": %d}\n' "$rc" "$timed_out" \
      $(( $(date +%s) - t0 )) "$TESTS_S" > "$LOGS/tests_meta.json"
  fi
fi

"${BENCH[@]}" --out "$OUT_DIR" --logs "$LOGS" --finalize --sections "$SECTIONS" "${SMOKE_ARG[@]}"
rc=$?
rm -rf "$LOGS"
echo "run.sh: done in $(elapsed) s; $OUT_DIR holds $(ls "$OUT_DIR" | tr '\n' ' ')"
exit $rc
