"""`ncjax sweep` through the CLI: a micro sweep on digits (`make test`: 2 learning rates x 1 seed, 2 runs; `make
test-all`: 2 learning rates x 2 seeds, 4 runs, and the 2 x 2 grid with 2 seeds, 8 runs) whose array-job task
(`--index`) runs exactly its own point and whose full run skips it; results, plots, HParams and best.json chosen on
the held-out validation part; another sweep in the same workdir refused; each bad input one line with nothing run;
the seeds a run's config takes. `slow`: SIGKILL mid-sweep and a bitwise resume, two `--shard` processes against one
process, and the best point's command re-run.

`make test`'s sweeps run the CLI's `main(argv)` in the test's process (tests/cli_in_process.py) on its 8 devices,
where the programs the runs share compile once; one bad input goes through a real `python -m ncjax.main` for the
entry point's own exit. The slow tests' sweeps run in subprocesses on one device (a SIGKILL needs a process of its
own; their reference sweep is the one they compare with bitwise), `ncjax.main` behind tests/shared_programs.py (the
suite's in-memory compile cache; the CLI path is the same), so a program that several runs share compiles once per
sweep process."""

import csv
import json
import os
import shlex
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

import cli_in_process
import multiprocess
from helpers import ROOT

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = (f"import sys; sys.path.insert(0, {TESTS!r}); import shared_programs; shared_programs.install(); "
          "from ncjax import main; main.run()")
# The grid: optim.lr x noise.ratio, 2 seeds; micro CLIP, 3 steps of 64 pairs, checkpoints every step (the SIGKILL
# test kills a run after its first); retrieval on the test split (and its twin on the validation part); no other
# evaluator.
STEPS = 3
CONFIG = ["--config=clip:model=micro,noise=0.4,batch=64", f"--config.total_steps={STEPS}",
          "--config.ckpt.every_steps=1", "--config.ckpt.async_save=False", "--config.evals.zeroshot.enabled=False",
          "--config.evals.noise_detection.enabled=False",
          "--config.log.progress=False"]
# `make test`'s in-process sweep: 2 steps, one checkpoint at the end of each run (nothing there is killed).
FAST_STEPS = 2
FAST_CONFIG = [f"--config.total_steps={FAST_STEPS}" if a.startswith("--config.total_steps=") else a for a in CONFIG
               if a != "--config.ckpt.every_steps=1"]
# `make test` sweeps 2 learning rates x 1 seed (2 runs: what a second seed changes in a run's config is checked
# without training, in test_bad_inputs_end_in_one_line_and_run_nothing; the table over seeds from records in
# tests/test_sweep.py); `make test-all` sweeps them with 2 seeds (4 runs), and the 2 x 2 grid (x noise.ratio) with 2
# seeds (8 runs), for the same checks.
GRIDS = {"small": ["--sweep=optim.lr=1e-3,3e-3"], "full": ["--sweep=optim.lr=1e-3,3e-3", "--sweep=noise.ratio=0.2,0.4"]}
SEEDS = 2
SELECT = ["--select=retrieval/rsum"]


def _names(grid: str, seeds: int = SEEDS) -> list[str]:
  ratios = ("_ratio=0.2", "_ratio=0.4") if grid == "full" else ("",)
  return [f"lr={lr}{r}_seed={s}" for lr in ("0.001", "0.003") for r in ratios for s in range(seeds)]


def _args(grid: str, config=CONFIG, devices=("--cpu_devices=1",), seeds: int = SEEDS) -> list[str]:
  # one device: the fastest for a process of its own
  return ["sweep", *config, *GRIDS[grid], f"--seeds={seeds}", *SELECT, *devices]


def _command(args):
  return [sys.executable, "-c", LAUNCH, *args]


def _sweep(args, workdir, timeout=600):
  return subprocess.run(_command([*args, f"--workdir={workdir}"]), cwd=ROOT, env=multiprocess.env(),
                        capture_output=True, text=True, timeout=timeout)


def _sweep_in_process(args, workdir):
  """The CLI's `main(argv)` here, on the test process's devices (JAX started long ago: no --cpu_devices)."""
  return cli_in_process.run([*args, f"--workdir={workdir}"], cwd=ROOT)


def _records(workdir, names):
  return {n: json.loads(open(os.path.join(workdir, "runs", n, "result.json")).read()) for n in names}


class Swept:
  """A sweep run as an array job's task (--index of its last point), then whole: in subprocesses on one device, or
  (`in_process`) in this process on its devices, with FAST_CONFIG."""

  def __init__(self, workdir: str, grid: str, in_process: bool = False, seeds: int = SEEDS):
    self.workdir, self.grid, self.seeds, self.names = workdir, grid, seeds, _names(grid, seeds)
    self.sweep = _sweep_in_process if in_process else _sweep
    self.config, self.steps = (FAST_CONFIG, FAST_STEPS) if in_process else (CONFIG, STEPS)
    self.devices = () if in_process else ("--cpu_devices=1",)
    self.args = _args(grid, self.config, self.devices, seeds)
    self.points = len(self.names) // seeds
    self.task = self.sweep([*self.args, f"--index={self.points - 1}"], workdir)
    assert self.task.returncode == 0, self.task.stderr[-3000:]
    self.ran_by_task = sorted(n for n in os.listdir(os.path.join(workdir, "runs"))
                              if os.path.isfile(os.path.join(workdir, "runs", n, "result.json")))
    self.results_after_task = os.path.exists(os.path.join(workdir, "results.csv"))
    self.whole = self.sweep(self.args, workdir)
    assert self.whole.returncode == 0, self.whole.stderr[-3000:]

  def records(self):
    return _records(self.workdir, self.names)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
  """2 learning rates x 2 seeds in subprocesses on one device, for the slow tests to compare with."""
  return Swept(str(tmp_path_factory.mktemp("sweep_small") / "w"), "small")


def test_micro_sweep_on_digits_its_array_task_results_best_point_and_one_sweep_per_workdir(tmp_path):
  swept = Swept(str(tmp_path / "w"), "small", in_process=True, seeds=1)
  check_index_runs_its_point_and_the_whole_sweep_the_rest_once(swept)
  check_results_table_plots_and_hparams(swept)
  check_best_point_is_chosen_on_the_validation_part_and_its_command_rebuilds_the_run(swept)
  check_another_sweep_in_the_same_workdir_is_refused_and_nothing_runs(swept)


@pytest.mark.slow
def test_2_learning_rates_with_2_seeds(small):
  check_index_runs_its_point_and_the_whole_sweep_the_rest_once(small)
  check_results_table_plots_and_hparams(small)
  check_best_point_is_chosen_on_the_validation_part_and_its_command_rebuilds_the_run(small)


@pytest.mark.slow
def test_a_2x2_grid_with_2_seeds(tmp_path):
  swept = Swept(str(tmp_path / "w"), "full")
  check_index_runs_its_point_and_the_whole_sweep_the_rest_once(swept)
  check_results_table_plots_and_hparams(swept)
  check_best_point_is_chosen_on_the_validation_part_and_its_command_rebuilds_the_run(swept)


def check_index_runs_its_point_and_the_whole_sweep_the_rest_once(swept):
  n, p, k = len(swept.names), swept.points, swept.seeds
  assert swept.task.stdout.startswith(f"sweep: {p} points x {k} seeds = {n} runs; this invocation: {k} runs of 1 "
                                      "points")
  assert swept.ran_by_task == swept.names[-k:]      # the last point's seeds, nothing else
  assert not swept.results_after_task                # the results are written once every run is finished
  progress = [line for line in swept.whole.stdout.splitlines() if line.startswith("[sweep]")]
  assert len(progress) == n and sum("done before" in line for line in progress) == k
  assert all(("done before" in line) == (line.split()[2].rstrip(":") in swept.ran_by_task) for line in progress)
  for name, rec in swept.records().items():
    cfg = json.load(open(os.path.join(swept.workdir, "runs", name, "config.json")))
    lr, seed = rec["point"]["optim.lr"], rec["seed"]
    ratio = rec["point"].get("noise.ratio", 0.4)
    assert (cfg["optim"]["lr"], cfg["noise"]["ratio"], cfg["seed"], cfg["noise"]["seed"]) == (lr, ratio, seed, seed)
    assert rec["steps"] == swept.steps and name in swept.names
    assert cfg["input"]["split"] == "train:fit" and cfg["evals"]["val_retrieval"]["split"] == "train:holdout"
    steps = sorted(int(s) for s in os.listdir(os.path.join(swept.workdir, "runs", name, "checkpoints")) if s.isdigit())
    assert steps[-1] == swept.steps


def check_results_table_plots_and_hparams(swept):
  workdir = swept.workdir
  rows = list(csv.DictReader(open(os.path.join(workdir, "results.csv"))))
  assert sorted(r["run"] for r in rows) == sorted(swept.names)
  assert {"optim.lr", "seed", "retrieval/rsum", "val_retrieval/rsum", "steps", "seconds"} <= set(rows[0])
  records = swept.records()
  table = open(os.path.join(workdir, "results.md")).read()
  keys = ["optim.lr"] + (["noise.ratio"] if swept.grid == "full" else [])
  groups = {}
  for rec in records.values():
    groups.setdefault(tuple(f"{rec['point'][k]:g}" for k in keys), []).append(rec["metrics"]["retrieval/rsum"])
  assert len(groups) == swept.points
  for values, rsums in groups.items():
    cells = next(c for l in table.splitlines() if (c := [x.strip() for x in l.split("|")[1:-1]])[:len(keys)] == list(
        values))
    assert cells[len(keys)] == str(swept.seeds) and f"{np.mean(rsums):.2f} ± {np.std(rsums):.2f}" in cells, (
        cells, rsums)
  for metric in ("retrieval_rsum", "val_retrieval_rsum"):
    for key in keys:
      assert os.path.getsize(os.path.join(workdir, f"plot_{metric}_vs_{key}.png")) > 1000
  sessions = _hparams_sessions(os.path.join(workdir, "tensorboard"))
  assert sorted(sessions) == sorted(swept.names)
  for name, (hparams, metrics) in sessions.items():
    rec = records[name]
    assert hparams == {**rec["point"], "seed": rec["seed"]}
    assert metrics["final/retrieval/rsum"] == pytest.approx(rec["metrics"]["retrieval/rsum"], rel=1e-6)


def check_best_point_is_chosen_on_the_validation_part_and_its_command_rebuilds_the_run(swept):
  workdir = swept.workdir
  best = json.load(open(os.path.join(workdir, "best.json")))
  records = swept.records()
  by_point = {}
  for rec in records.values():
    by_point.setdefault(rec["index"], []).append(rec["metrics"])
  val = {i: np.mean([m["val_retrieval/rsum"] for m in ms]) for i, ms in by_point.items()}
  assert best["chosen_by"] == "val_retrieval/rsum" and best["point_index"] == max(val, key=lambda i: (val[i], -i))
  assert best["validation"]["split"] == "train:holdout" and best["validation"]["source"] == "holdout"
  assert "warning" not in best
  test = np.mean([m["retrieval/rsum"] for m in by_point[best["point_index"]]])
  assert best["test_metrics"]["retrieval/rsum"]["mean"] == pytest.approx(test)
  assert not any(k.startswith("val_") for k in best["test_metrics"])
  # The command builds the config the run trained with (its validation twin aside).
  args = shlex.split(best["command"])
  assert args[:2] == ["ncjax", "train"]
  run = best["runs"][0]
  assert args[-1] == f"--workdir={os.path.join(workdir, 'reproduce', run)}"
  cfg = _config_of_command(args[2:-1])
  saved = json.load(open(os.path.join(workdir, "runs", run, "config.json")))
  saved["evals"].pop("val_retrieval")
  assert json.loads(json.dumps(cfg.to_dict(), default=str)) == saved


def check_another_sweep_in_the_same_workdir_is_refused_and_nothing_runs(small):
  workdir = small.workdir
  before = sorted(os.listdir(os.path.join(workdir, "runs")))
  out = small.sweep(["sweep", *small.config, "--sweep=optim.lr=1e-3,1e-2", f"--seeds={small.seeds}", *SELECT,
                     *small.devices], workdir)
  line = _one_error_line(out, 2)
  assert "holds another sweep" in line and "optim.lr" in line and "0.003" in line and "0.01" in line
  assert sorted(os.listdir(os.path.join(workdir, "runs"))) == before
  # the same sweep: its report, nothing trained. Its plots are the ones the whole sweep drew (checked above): in this
  # process they are not drawn again, the report's call for them recorded instead.
  from unittest import mock
  from ncjax.sweep import results
  replotted = []
  with mock.patch.object(results, "write_plots", lambda rows, keys, metrics, workdir: replotted.append(
      (len(rows), keys, sorted(metrics))) or []):
    again = small.sweep([*small.args, "--report"], workdir)
  assert again.returncode == 0 and "[sweep]" not in again.stdout and "best point" in again.stdout
  if small.sweep is _sweep_in_process:   # the report plots what the whole sweep drew
    (points, keys, metrics), = replotted
    assert points == small.points and keys == ["optim.lr"], replotted
    assert {"retrieval/rsum", "val_retrieval/rsum"} <= set(metrics), metrics
    for metric in metrics:
      assert os.path.isfile(os.path.join(workdir, f"plot_{metric.replace('/', '_')}_vs_optim.lr.png")), metric


def test_bad_inputs_end_in_one_line_and_run_nothing(tmp_path):
  base = ["sweep", "--config=clip:model=micro"]
  cases = {
      "unknown key": (["--sweep=optim.lrr=1e-3,2e-3"], "the config has no key 'optim.lrr'"),
      "wrong type": (["--sweep=optim.lr=1e-3,fast"], "value 'fast' is not a float"),
      "empty list": (["--sweep=optim.lr="], "an empty list of values for optim.lr"),
      "index past the end": (["--sweep=optim.lr=1e-3,2e-3", "--seeds=2", "--index=2"], "--index=2 is past the last"),
      "index and shard": (["--sweep=optim.lr=1e-3,2e-3", "--index=0", "--shard=0/2"], "--index and --shard"),
      "bad shard": (["--sweep=optim.lr=1e-3,2e-3", "--shard=2/2"], "--shard=2/2"),
      "select without split": (["--select=noise_detection/auc"], "evaluates no split"),
  }
  for name, (args, words) in cases.items():
    workdir = tmp_path / name.replace(" ", "_")
    assert words in _one_error_line(_sweep_in_process([*base, *args], str(workdir)), 2), name
    assert not os.path.exists(workdir), name       # nothing written, nothing run
  # ... and through a real process (the entry point's own exit status, nothing printed after the line)
  args, words = cases["index past the end"]
  assert words in _one_error_line(_sweep([*base, *args, "--cpu_devices=1"], str(tmp_path / "real")), 2)
  assert not os.path.exists(tmp_path / "real")
  dry = _sweep_in_process([*base, "--sweep=optim.lr=1e-3,2e-3", "--sweep=model.embed_dim=16,32", "--seeds=2",
                           "--shard=1/2", "--dry_run"], str(tmp_path / "dry"))
  assert dry.returncode == 0, dry.stderr[-2000:]
  lines = dry.stdout.splitlines()
  assert lines[0] == "sweep: 4 points x 2 seeds = 8 runs; this invocation: 4 runs of 2 points"
  assert [l.split()[2] for l in lines[1:]] == [f"runs/lr={lr}_embed_dim={d}_seed={s}" for lr, d in
                                               (("0.001", 32), ("0.002", 32)) for s in (0, 1)]
  assert not os.path.exists(tmp_path / "dry")
  # What each seed sets in the config its run trains with (the runner's `config_of`; the micro sweep above trains
  # one seed): the initialisation, the data order and the noise, beside the point's own value.
  from helpers import load_config
  from ncjax import sweep
  plan = sweep.plan(load_config("clip", "model=micro"), sweep_flags=["optim.lr=1e-3,2e-3"], seeds=2)
  assert [(dict(r.point)["optim.lr"], r.seed) for r in plan.runs] == [(1e-3, 0), (1e-3, 1), (2e-3, 0), (2e-3, 1)]
  for run in plan.runs:
    cfg = plan.config_of(run)
    assert (cfg.seed, cfg.noise.seed, cfg.input.shuffle_seed) == (run.seed,) * 3, run.name
    assert cfg.optim.lr == dict(run.point)["optim.lr"], run.name


# --- slow: killed mid-sweep, shards, the best point's command -----------------------------------------------------
@pytest.mark.slow
def test_sigkill_mid_sweep_resumes_the_killed_run_bitwise_and_finishes_every_run_once(small, tmp_path):
  reference, names = small.workdir, small.names
  workdir = str(tmp_path / "w")
  victim = names[2]     # the third run: two runs finished before it, one after it
  proc = subprocess.Popen(_command([*small.args, f"--workdir={workdir}"]), cwd=ROOT, env=multiprocess.env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  first_ckpt = os.path.join(workdir, "runs", victim, "checkpoints", "1")
  deadline = time.monotonic() + 600
  while not os.path.isdir(first_ckpt) and proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not os.path.exists(os.path.join(workdir, "runs", victim, "result.json"))
  finished = sorted(n for n in names if os.path.isfile(os.path.join(workdir, "runs", n, "result.json")))
  assert finished == sorted(names[:2])
  killed_at = max(int(s) for s in os.listdir(os.path.dirname(first_ckpt)) if s.isdigit())
  assert killed_at < 3
  again = _sweep(small.args, workdir)
  assert again.returncode == 0, again.stderr[-3000:]
  progress = [line for line in again.stdout.splitlines() if line.startswith("[sweep]")]
  assert [("done before" in line) for line in progress] == [True, True, False, False]
  assert f"resumed from step {killed_at}" in again.stderr and again.stderr.count("resumed from step") == 1
  ours, theirs = _records(workdir, names), _records(reference, names)
  for name in names:
    assert ours[name]["metrics"] == theirs[name]["metrics"], name
  _assert_same_params(os.path.join(workdir, "runs", victim), os.path.join(reference, "runs", victim), step=3)


@pytest.mark.slow
def test_two_shard_processes_produce_what_one_sweep_produces(small, tmp_path):
  reference, names = small.workdir, small.names
  workdir = str(tmp_path / "w")
  procs = [subprocess.Popen(_command([*small.args, f"--shard={i}/2", f"--workdir={workdir}"]), cwd=ROOT,
                            env=multiprocess.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  outs = [p.communicate(timeout=900) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
  ours = _records(workdir, names)
  assert ours == {n: dict(r, seconds=ours[n]["seconds"]) for n, r in _records(reference, names).items()}
  ours = list(csv.DictReader(open(os.path.join(workdir, "results.csv"))))
  theirs = list(csv.DictReader(open(os.path.join(reference, "results.csv"))))
  drop = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]   # noqa: E731
  assert drop(ours) == drop(theirs)
  assert json.load(open(os.path.join(workdir, "best.json")))["point"] == \
      json.load(open(os.path.join(reference, "best.json")))["point"]


@pytest.mark.slow
def test_the_best_points_command_trains_the_same_run(small):
  workdir = small.workdir
  best = json.load(open(os.path.join(workdir, "best.json")))
  args = shlex.split(best["command"])
  out = subprocess.run(_command(args[1:]), cwd=ROOT, env=multiprocess.env(), capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  run = best["runs"][0]
  again = json.load(open(os.path.join(workdir, "reproduce", run, "eval", "step_3.json")))["results"]["retrieval"]
  rec = json.load(open(os.path.join(workdir, "runs", run, "result.json")))["metrics"]
  assert {k: v for k, v in again.items() if isinstance(v, float)} == \
      {k[len("retrieval/"):]: v for k, v in rec.items() if k.startswith("retrieval/")}


@pytest.mark.slow
def test_on_two_processes_every_process_takes_the_same_run(tmp_path):
  """A pod: 2 processes x 1 device train each run together (one JAX job) and write what 1 process x 2 devices
  writes, run for run (to within one retrieval query: the collectives sum in another order)."""
  args = ["sweep", *CONFIG, *GRIDS["small"], "--select=retrieval/rsum"]
  names = ["lr=0.001", "lr=0.003"]
  codes = multiprocess.run([*args, f"--workdir={tmp_path / 'pod'}"], processes=2, devices=1,
                           log_dir=str(tmp_path / "logs"))
  assert codes == [0, 0], multiprocess.logs(str(tmp_path / "logs"))
  logs = multiprocess.logs(str(tmp_path / "logs"), tail=None)
  assert logs.count("[sweep] 1/2 lr=0.001:") == 1 and logs.count("[sweep] 2/2 lr=0.003:") == 1   # printed by process 0
  one = _sweep([*args, "--cpu_devices=2"], str(tmp_path / "one"))
  assert one.returncode == 0, one.stderr[-3000:]
  pod, ref = _records(str(tmp_path / "pod"), names), _records(str(tmp_path / "one"), names)
  for name in names:
    assert (pod[name]["steps"], pod[name]["noise_sha256"]) == (ref[name]["steps"], ref[name]["noise_sha256"])
    for key in ("retrieval/rsum", "val_retrieval/rsum"):
      assert pod[name]["metrics"][key] == pytest.approx(ref[name]["metrics"][key], abs=6 * 100 / 144 + 1e-6), key
  assert json.load(open(tmp_path / "pod" / "best.json"))["point"] in ({"optim.lr": 1e-3}, {"optim.lr": 3e-3})


# --- helpers ------------------------------------------------------------------------------------------------------
def _one_error_line(out, status) -> str:
  lines = [line for line in out.stderr.splitlines() if line.strip()]
  errors = [line for line in lines if line.startswith("ncjax: error:")]
  assert out.returncode == status, (out.returncode, out.stderr[-3000:])
  assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in out.stderr, out.stderr[-3000:]
  return errors[0]


def _config_of_command(args):
  """The config `ncjax train ARGS` builds, parsed by the CLI's own --config flag (on flags of its own)."""
  from absl import flags
  from ncjax.cli import main
  values = flags.FlagValues()
  parser = main._ConfigSpecParser(name="config", lock_config=True)   # noqa: SLF001
  flag_class = main._ConfigFlag   # noqa: SLF001
  flag = flag_class(parser=parser, serializer=flags.ArgumentSerializer(), name="config", default=None,
                    help_string="", flag_values=values, sys_argv=["ncjax", *args])
  flags.DEFINE_flag(flag, flag_values=values)
  values(["ncjax", *args], known_only=True)
  return values.config


def _assert_same_params(a: str, b: str, step: int):
  from ncjax import checkpoint as ckpt_lib
  pa, _, _ = ckpt_lib.restore_params(os.path.join(a, "checkpoints", str(step)))
  pb, _, _ = ckpt_lib.restore_params(os.path.join(b, "checkpoints", str(step)))
  import jax
  for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _hparams_sessions(tb_dir: str) -> dict:
  """{run: (hparams, final metrics)} read back from TensorBoard's event files (TFRecord framing: length, its crc,
  the Event proto, its crc): each run's session start (the HParams plugin's data) and its metric scalars."""
  from tensorboardX.proto import event_pb2, plugin_hparams_pb2
  out = {}
  for run in os.listdir(tb_dir):
    if not os.path.isdir(os.path.join(tb_dir, run)):
      continue
    hparams, metrics = {}, {}
    for name in os.listdir(os.path.join(tb_dir, run)):
      data = open(os.path.join(tb_dir, run, name), "rb").read()
      pos = 0
      while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
        pos += 16 + length
        for value in event.summary.value:
          plugin = value.metadata.plugin_data
          if plugin.plugin_name == "hparams":
            content = plugin_hparams_pb2.HParamsPluginData.FromString(plugin.content)
            if content.HasField("session_start_info"):
              for k, v in content.session_start_info.hparams.items():
                hparams[k] = getattr(v, v.WhichOneof("kind"))
          elif value.HasField("simple_value"):
            metrics[value.tag] = value.simple_value
    out[run] = (hparams, metrics)
  return out
