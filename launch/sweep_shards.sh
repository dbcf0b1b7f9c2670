#!/usr/bin/env bash
# A sweep split over N independent machines (or N processes of one machine), each taking every N-th point:
#   launch/sweep_shards.sh N WORKDIR SWEEP_FLAGS...          e.g.
#   launch/sweep_shards.sh 2 /tmp/sweep --config=clip:model=micro,noise=0.4 --sweep=optim.lr=1e-3,3e-3 --seeds=2
# Here the N shards run as N local processes with 4 simulated CPU devices each; on N machines run
# `ncjax sweep ... --shard=I/N` on machine I with a shared (gs://) workdir. The shard that finishes last writes
# the results; together they write what one process's sweep writes.
set -euo pipefail
n=${1:?shards}; workdir=${2:?workdir}; shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$here/.venv/bin/python}
pids=()
for ((i = 0; i < n; i++)); do
  "$python" -m ncjax.main sweep "$@" --workdir="$workdir" --shard="$i/$n" --cpu_devices=4 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
