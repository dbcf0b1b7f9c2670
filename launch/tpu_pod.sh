#!/usr/bin/env bash
# Cloud TPU pod slice: the same command on every worker; jax.distributed.initialize() auto-detects the slice.
#   gcloud compute tpus tpu-vm ssh $TPU --worker=all \
#       --command="cd ncjax && launch/tpu_pod.sh configs/clip.py gs://bucket/run"
# The workdir belongs in object storage (every worker reads and writes it). A maintenance event sends SIGTERM:
# every worker stops at the same step, saves it and exits 75; this loop then starts the run again (it resumes from
# that checkpoint) — up to NCJAX_RESTARTS times (default 20). A lost worker makes the others stop within the
# heartbeat timeout; they restart too, and the job continues once every worker is back.
set -uo pipefail
config=${1:?config}; workdir=${2:?workdir}; shift 2
restarts=${NCJAX_RESTARTS:-20}
for ((attempt = 0; attempt <= restarts; attempt++)); do
  .venv/bin/python -m ncjax.main train --config="$config" --workdir="$workdir" --distributed "$@"
  status=$?
  case $status in
    0) exit 0 ;;
    75) echo "tpu_pod: preempted; resuming from the saved checkpoint" >&2 ;;
    134) echo "tpu_pod: a worker was lost; restarting from the last checkpoint" >&2; sleep 30 ;;
    *) exit $status ;;   # a real error (a bad config, a crash): do not loop on it
  esac
done
echo "tpu_pod: gave up after $restarts restarts" >&2
exit 1
