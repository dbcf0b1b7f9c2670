#!/usr/bin/env bash
# Run one ncjax command as N local processes (a stand-in for a multi-host pod), each with CPU devices:
#   launch/local_multiprocess.sh 2 4 train --config=configs/clip.py:noise=0.4 --workdir=/tmp/mp
# = 2 processes x 4 simulated CPU devices = an 8-device global mesh. Any command: train (the default), eval,
# ncbench, export. Exit status: 0 when every process succeeded; 75 when the run was preempted (SIGTERM: every
# process saved the same step; relaunch to resume); otherwise the first failing process's status, reported.
set -uo pipefail
nproc=${1:?number of processes}; ndev=${2:?CPU devices per process}; shift 2
port=${NCJAX_COORDINATOR_PORT:-$((20000 + RANDOM % 20000))}
py=${PYTHON:-.venv/bin/python}
pids=()
for ((i = 0; i < nproc; i++)); do
  "$py" -m ncjax.main "$@" --cpu_devices="$ndev" --num_processes="$nproc" --process_id="$i" \
      --coordinator_address="127.0.0.1:$port" &
  pids+=($!)
done
# A SIGTERM to this script (a scheduler's preemption notice) goes to every process, as a cluster's would.
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM
status=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; s=$?
  while [ $s -gt 128 ] && kill -0 "${pids[$i]}" 2>/dev/null; do wait "${pids[$i]}"; s=$?; done  # a trapped signal
  if [ $s -ne 0 ]; then
    [ $s -eq 75 ] || echo "local_multiprocess: process $i exited with status $s$([ $s -gt 128 ] && echo " (signal $((s - 128)))")" >&2
    [ $status -eq 0 ] && status=$s
  fi
done
exit $status
