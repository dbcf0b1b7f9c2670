"""A test plugin (`ncjax train --plugins=tests/plugins/record_web_ids.py`): every process appends the example ids of
each web host batch it assembles, one line `step id id ...`, to $NCJAX_RECORD_IDS/process_<jax.process_index()>.txt
— what tests/train/test_web_multiprocess.py checks the processes' reads with. Nothing in ncjax is edited."""

import os

import jax

from ncjax.data.web import pipeline as web_pipeline

_assemble = web_pipeline.WebTrainData.assemble


def _recording_assemble(self, step, specs, decoded):
  batch = _assemble(self, step, specs, decoded)
  directory = os.environ.get("NCJAX_RECORD_IDS")
  if directory:
    with open(os.path.join(directory, f"process_{jax.process_index()}.txt"), "a") as f:
      f.write(" ".join(str(int(x)) for x in [step, *batch["id"]]) + "\n")
  return batch


web_pipeline.WebTrainData.assemble = _recording_assemble
