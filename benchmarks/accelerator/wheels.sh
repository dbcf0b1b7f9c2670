#!/usr/bin/env bash
# Downloads into <repo>/.whl/ the wheels that the GPU host's image lacks, for its Python 3.12 on manylinux x86_64,
# so that benchmarks/accelerator/run.sh can install them there without a network (`pip install --no-index
# --no-deps --target`). Run it on a machine that reaches PyPI; .whl/ is ignored by git and travels with the device
# call that names it (carry=[".whl"]).
#
# What the image has (GPU host, the device tool's package list of 2026-11-17): Python 3.12.3, jax 0.11.2 + the CUDA
# 13 plugin, flax, optax, orbax-checkpoint, chex, etils, tensorstore, numpy, torch 2.11 (+cu130), timm, transformers,
# safetensors, sentencepiece, tokenizers, pyarrow, fsspec, pillow, scikit-learn, matplotlib, rich, absl-py, pytest,
# pytest-xdist, hypothesis, attrs, cloudpickle, wrapt, six, equinox, lineax, jaxtyping, wadler-lindig, and what those
# depend on. A wheel of a package the image has would shadow the image's copy on PYTHONPATH: none is carried. What ncjax imports on the check's paths beyond that is listed below with the
# module that pulls it in: the packages ncjax requires, and the pure-Python dependencies of theirs that the image's
# own packages do not bring (found by importing the check's paths in a Python 3.12 environment holding only the
# image's packages plus these wheels). The versions are the ones proven under jax 0.11.2 in /work/venv312.
#
# Usage: bash benchmarks/accelerator/wheels.sh [--python PYTHON]   (PYTHON runs pip; default python3)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=python3
if [[ ${1:-} == --python ]]; then PYTHON=$2; fi
DEST="$REPO/.whl"
LIMIT_MIB=40

WHEELS=(
  # ncjax's own requirements that the image lacks
  ott-jax==0.6.0               # ncjax.ot (OttSinkhorn), tests/ot
  ml-collections==1.1.0        # ncjax.config_lib
  grain==0.2.18                # ncjax.data.pipeline
  array-record==0.8.6          # grain's record reader (imported by `import grain`)
  tensorflow-datasets==4.9.10  # ncjax.data.tables.builders (built datasets)
  tensorboardX==2.6.5          # ncjax.logging_utils (log.tensorboard=True)
  ftfy==6.3.1                  # CLIP's BPE cleaning of non-ASCII captions
  open-clip-torch==3.3.0       # the torch baseline of benchmarks/accelerator/bench.py section b
  # what ott-jax imports that the image lacks (it has lineax, equinox, jaxtyping and wadler-lindig)
  jaxopt==0.8.5
  # what `import grain` imports that the image lacks (it has attrs and cloudpickle)
  portpicker==1.6.0
  # what `import tensorflow_datasets` imports (its read path included: tensorflow_datasets.core.download imports
  # promise at module level)
  dm-tree==0.1.10
  immutabledict==4.3.1
  simple-parsing==0.1.9
  docstring-parser==0.18.0
  tensorflow-metadata==1.21.0
  termcolor==3.3.0
  toml==0.10.2
  # ftfy's
  wcwidth==0.9.4
)
# promise (tfds) is published only as an sdist; it is pure Python, so its wheel is built here (py3-none-any).
SDIST_WHEELS=(promise==2.3)

PLATFORMS=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
           manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$tag")
done

mkdir -p "$DEST"
for spec in "${WHEELS[@]}"; do
  "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp "${PLATFORMS[@]}" -d "$DEST" "$spec"
done
for spec in "${SDIST_WHEELS[@]}"; do
  name=${spec%%==*}
  if ! ls "$DEST"/"${name}"-*.whl >/dev/null 2>&1; then
    "$PYTHON" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$DEST" "$spec"
  fi
done

# Exactly one wheel per pinned name: a stale version left from an earlier pin would be installed beside it.
expected=$(( ${#WHEELS[@]} + ${#SDIST_WHEELS[@]} ))
found=$(ls "$DEST"/*.whl | wc -l)
if (( found != expected )); then
  echo "wheels.sh: $DEST holds $found wheels, expected $expected (one per pin): remove stale ones" >&2
  ls -1 "$DEST" >&2
  exit 1
fi

total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
ls -1s --block-size=K "$DEST"/*.whl | sed "s|$DEST/||"
total_mib=$(awk -v b="$total" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "total: $found wheels, $total_mib MiB in $DEST"
if (( total > LIMIT_MIB * 1048576 )); then
  echo "wheels.sh: the wheels come to $total_mib MiB, over the $LIMIT_MIB MiB that may travel with a device call" >&2
  exit 1
fi
