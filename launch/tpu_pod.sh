#!/usr/bin/env bash
# Cloud TPU pod slice: the same command on every worker; jax.distributed.initialize() auto-detects the slice.
#   gcloud compute tpus tpu-vm ssh $TPU --worker=all --command="cd ncjax && launch/tpu_pod.sh configs/clip.py gs://bucket/run"
set -euo pipefail
config=${1:?config}; workdir=${2:?workdir}; shift 2
exec .venv/bin/python -m ncjax.main --config="$config" --workdir="$workdir" --distributed "$@"
