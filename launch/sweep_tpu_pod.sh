#!/usr/bin/env bash
# A whole sweep on a Cloud TPU pod slice: the same command on every worker, every point in turn, each point on all
# the slice's chips (every process takes the same run; which runs are finished is worker 0's view, broadcast).
#   gcloud compute tpus tpu-vm ssh $TPU --worker=all --command="cd ncjax && launch/sweep_tpu_pod.sh \
#       gsc:noise=0.4 gs://bucket/sweeps/gsc --sweep=loss.gamma=0.01,0.1 --sweep=optim.lr=1e-4,2e-4 --seeds=3 \
#       --select=retrieval/rsum"
# Preempted (75) or a worker lost (134): started again; finished runs are skipped, the killed one resumes from its
# checkpoint (up to NCJAX_RESTARTS times, default 20).
set -uo pipefail
config=${1:?config}; workdir=${2:?workdir}; shift 2
restarts=${NCJAX_RESTARTS:-20}
for ((attempt = 0; attempt <= restarts; attempt++)); do
  .venv/bin/python -m ncjax.main sweep --config="$config" --workdir="$workdir" --distributed "$@"
  status=$?
  case $status in
    0) exit 0 ;;
    75) echo "sweep_tpu_pod: preempted; resuming" >&2 ;;
    134) echo "sweep_tpu_pod: a worker was lost; restarting" >&2; sleep 30 ;;
    *) exit $status ;;
  esac
done
echo "sweep_tpu_pod: gave up after $restarts restarts" >&2
exit 1
