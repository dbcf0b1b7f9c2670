"""The accelerator check: a GPU slice of the test suite and one table of GPU measurements (`run.sh`, `bench.py`).

Modules: `bench` (the command: sections in priority order under one time budget, each in its own process, and the
table), `jax_work` (ncjax's steps, memory and NCU loss on the device), `torch_work` (the open_clip baseline and the
public NCU loop on the same card), `ncu_public` (that loop, restated in PyTorch), `record` (rows, deadlines, inputs
shared by both sides without importing either framework), `pytest_counts` (the test slice's outcomes, kept even
when the slice is stopped at its time limit).
"""
