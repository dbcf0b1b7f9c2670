"""The method-agnostic trainer.

It takes an experiment assembled from a config (`ncjax.experiment`: mesh, data, method); creates the train state
already sharded (`eval_shape` -> shardings -> `jit(init, out_shardings=...)`) or restores it from the latest
checkpoint in the workdir; and runs, stage by stage, one jitted step with explicit in/out shardings and donated
state. The trainer knows nothing about any particular method: stages, updates, parameter groups, per-sample state
and epoch hooks all come from the Method object (see ncjax/methods/base.py and docs/architecture.md).

Train state: {'step': int32, 'params': {module: ...}, 'opt_state': {update name: optax state},
'method_state': pytree}. The RNG of step s is fold_in(PRNGKey(seed), s), so nothing random needs checkpointing.

By responsibility: `trainer` (the `Trainer`: state and the loop), `program` (a stage's optimisers and jitted step),
`schedule` (stages on the step axis), `saving` (the checkpoint and preemption policy), `resume` (the checks that a
checkpoint continues the same run), `step_log` (metrics read one step late).
"""

from ncjax.train.program import StageProgram
from ncjax.train.resume import check_resumable
from ncjax.train.saving import (PREEMPTED_EXIT_STATUS, Preempted, PreemptionWatch, SavePolicy, SaveSchedule,
                                end_of_step)
from ncjax.train.schedule import StageSpan, span_at, stage_spans, total_steps_of
from ncjax.train.step_log import StepLog
from ncjax.train.trainer import Trainer, TrainResult, train

__all__ = ["Trainer", "TrainResult", "train", "StageProgram", "StageSpan", "stage_spans", "span_at",
           "total_steps_of", "PREEMPTED_EXIT_STATUS", "Preempted", "PreemptionWatch", "SavePolicy", "SaveSchedule",
           "end_of_step", "check_resumable", "StepLog"]
