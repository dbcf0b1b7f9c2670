#!/usr/bin/env bash
# Run one ncjax training job as N local processes (a stand-in for a multi-host pod), each with CPU devices.
#   launch/local_multiprocess.sh 2 4 --config=configs/clip.py:noise=0.4 --workdir=/tmp/mp
# = 2 processes x 4 simulated CPU devices = an 8-device global mesh.
set -euo pipefail
nproc=${1:?number of processes}; ndev=${2:?CPU devices per process}; shift 2
port=${NCJAX_COORDINATOR_PORT:-$((20000 + RANDOM % 20000))}
py=${PYTHON:-.venv/bin/python}
pids=()
for ((i = 0; i < nproc; i++)); do
  "$py" -m ncjax.main "$@" --cpu_devices="$ndev" --num_processes="$nproc" --process_id="$i" \
      --coordinator_address="127.0.0.1:$port" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
