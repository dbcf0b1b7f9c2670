"""Stages laid out on the global step axis: which steps each of a method's stages spans."""

from __future__ import annotations

import dataclasses

from ncjax.contract import Stage

@dataclasses.dataclass(frozen=True)
class StageSpan:
  index: int
  stage: Stage
  start: int       # first global step of the stage
  steps: int       # scheduled length (the lr schedule always spans it, even when total_steps cuts the run short)
  run_steps: int   # scheduled length of the whole run (run-scope schedules)


def stage_spans(stages, steps_per_epoch: int) -> list[StageSpan]:
  lengths = [int(st.steps) if st.steps else int(st.epochs) * steps_per_epoch for st in stages]
  spans, start = [], 0
  for i, (st, n) in enumerate(zip(stages, lengths)):
    spans.append(StageSpan(i, st, start, n, sum(lengths)))
    start += n
  return spans


def total_steps_of(config, spans) -> int:
  scheduled = sum(s.steps for s in spans)
  return scheduled if config.total_steps is None else min(int(config.total_steps), scheduled)


def span_at(spans, step: int) -> StageSpan:
  for s in spans:
    if step < s.start + s.steps:
      return s
  return spans[-1]


