"""A newcomer's mistakes through the CLI (ncjax.errors): each ends as one line `ncjax: error: ...` naming the
problem, the last thing on stderr, with its kind's exit status and no traceback — including `ncjax audit` of a run
with no checkpoint (whose orbax thread used to print after the message) and a 2-process run that finds the same
problem in both processes (printed once). `--verbose` adds the traceback; an error of ncjax itself keeps its
traceback and exit status 1.

The cases run the CLI's `main(argv)` in this process (tests/cli_in_process.py: a subprocess per case re-imports JAX
for nothing the case checks); the audit case runs as a real `python -m ncjax.main`, for what only a process shows:
absl's entry point, the exit status the process leaves with and nothing printed after the line by a background
thread."""

import contextlib
import subprocess
import sys

import pytest

import cli_in_process
import multiprocess

PY = sys.executable


@contextlib.contextmanager
def _modules(entries: dict):
  """sys.modules with `entries` set, each put back afterwards (only these: mock.patch.dict would also drop every
  module the command imported, and a module imported twice breaks its users' identity checks)."""
  before = {name: sys.modules[name] for name in entries if name in sys.modules}
  sys.modules.update(entries)
  try:
    yield
  finally:
    for name in entries:
      sys.modules.pop(name, None)
    sys.modules.update(before)


def _cli(args, tmp_path, extra_env=None, timeout=300):
  env = multiprocess.env(extra_env)
  return subprocess.run([PY, "-m", "ncjax.main", *args], cwd=str(tmp_path), env=env, capture_output=True,
                        text=True, timeout=timeout)


def _assert_one_line(out, status, *names):
  lines = [line for line in out.stderr.splitlines() if line.strip()]
  errors = [line for line in lines if line.startswith("ncjax: error:")]
  assert out.returncode == status, (out.returncode, out.stderr[-3000:])
  assert len(errors) == 1 and lines[-1] == errors[0], out.stderr[-3000:]   # one line, and nothing after it
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  for name in names:
    assert name in errors[0], (name, errors[0])
  return errors[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A CLIP workdir on digits with a checkpoint (its step 0, written here: the cases below read its metadata, never
  its weights)."""
  from helpers import make_config
  from ncjax import train
  workdir = str(tmp_path_factory.mktemp("errors_run") / "run")
  trainer = train.Trainer(make_config("clip", "model=micro,batch=64,noise=0.4"), workdir)
  state, span = trainer.restore_or_init()
  trainer.save(state, 0, span, force=True)
  trainer.checkpointer.wait()
  return workdir


def test_bad_inputs_end_in_one_clear_line_with_the_exit_status_of_their_kind(tmp_path, trained):
  empty = tmp_path / "empty"
  empty.mkdir()
  (tmp_path / "web").mkdir()
  import numpy as np
  np.save(tmp_path / "short_noise.npy", np.arange(7))
  (tmp_path / "garbage.pt").write_bytes(bytes(range(256)) * 3)
  from ncjax.data.web import synthetic as web_synthetic
  web_synthetic.write_img2dataset(str(tmp_path / "web"), 64, per_shard=32, image_size=8, pool=2)
  run = ["train", "--cpu_devices=8"]
  not_installed = {"simplejpeg": None}   # `import simplejpeg` raises ImportError, as if not installed
  cases = {   # name: (args, modules hidden, exit status, words the line must hold)
      "a web root that does not exist": (
          run + ["--config=clip:model=micro,data=web:/nonexistent", f"--workdir={tmp_path}/w1"], {}, 3,
          ("/nonexistent", "no WebDataset shards")),
      "a batch the devices do not divide": (
          run + ["--config=clip:model=micro,batch=100", f"--workdir={tmp_path}/w2"], {}, 6,
          ("100", "8 devices", "multiple of 8")),
      "a model size that does not exist": (
          run + ["--config=clip:model=nano", f"--workdir={tmp_path}/w3"], {}, 2, ("'nano'", "known sizes")),
      "a table dataset not built": (
          run + ["--config=clip:model=micro,data=tfds:web_pairs/custom_table", f"--config.input.data_dir={empty}",
                 f"--workdir={tmp_path}/w4"], {}, 3, ("not built", "python -m ncjax.data.build")),
      "eval of a directory without checkpoints": (
          ["eval", f"--checkpoints={empty}"], {}, 4, (str(empty), "holds no checkpoint")),
      "a resume whose noise differs": (
          run + ["--config=clip:model=micro,batch=64,noise=0.2", "--config.total_steps=2", "--config.evals={}",
                 f"--workdir={trained}"], {}, 4, ("cannot resume", "noisy pairs", "new --workdir")),
      "NCU without a model to start from": (
          run + ["--config=ncu:model=micro", f"--workdir={tmp_path}/w5"], {}, 2, ("'ncu'", "init=", "init=random")),
      "a misspelt config key": (
          run + ["--config=clip:model=micro", "--config.optim.lrr=1", f"--workdir={tmp_path}/w6"], {}, 2,
          ("optim.lrr", "optim.lr")),
      "a config that does not exist": (
          run + ["--config=nosuchmethod", f"--workdir={tmp_path}/w7"], {}, 2, ("nosuchmethod",)),
      "a workdir that cannot take files": (
          run + ["--config=clip:model=micro", "--workdir=/proc/ncjax_run"], {}, 5, ("/proc/ncjax_run",
                                                                                   "not writable")),
      "export without an output": (["export", f"--checkpoint={trained}"], {}, 2, ("--output",)),
      "a noise file of the wrong length": (
          run + ["--config=clip:model=micro", "--config.noise.kind=file",
                 f"--config.noise.file={tmp_path}/short_noise.npy", f"--workdir={tmp_path}/w9"], {}, 2,
          ("short_noise.npy", "shape (7,)")),
      "a pretrained file that is not one": (
          run + [f"--config=clip:init=openai:{tmp_path}/garbage.pt", f"--workdir={tmp_path}/w10"], {}, 4,
          ("garbage.pt", "not a readable PyTorch checkpoint")),
      # (a loss that goes non-finite, status 8: tests/train/test_trainer.py, in-process — its one line is this
      # test's one line of every kind)
      "a missing optional dependency": (
          run + [f"--config=clip:model=micro,batch=32,data=web:{tmp_path}/web", "--config.input.web.decoder=simplejpeg",
                 f"--workdir={tmp_path}/w8"], not_installed, 7, ("simplejpeg", "pip install")),
  }
  for name, (args, hidden, status, words) in cases.items():
    with _modules(hidden):
      out = cli_in_process.run(args, cwd=str(tmp_path))
    try:
      _assert_one_line(out, status, *words)
    except AssertionError as e:
      raise AssertionError(f"{name}: {e}") from None
  # The one case through a real process: audit's orbax thread used to print after the line.
  out = _cli(["audit", f"--checkpoint={empty}", f"--output={tmp_path}/audit"], tmp_path)
  _assert_one_line(out, 4, "holds no checkpoint")


def test_verbose_adds_the_traceback_and_an_internal_error_keeps_its_own(tmp_path):
  out = cli_in_process.run(["train", "--config=clip:model=nano", f"--workdir={tmp_path}/w", "--verbose"],
                           cwd=str(tmp_path))
  assert out.returncode == 2 and "Traceback" in out.stderr
  assert out.stderr.strip().splitlines()[-1].startswith("ncjax: error: unknown model size 'nano'")
  plugin = tmp_path / "broken_plugin.py"
  plugin.write_text("raise RuntimeError('a bug in ncjax or a plugin')\n")
  out = cli_in_process.run(["train", "--config=clip:model=micro", f"--workdir={tmp_path}/w", f"--plugins={plugin}"],
                           cwd=str(tmp_path))
  assert out.returncode == 1 and "Traceback" in out.stderr and "RuntimeError: a bug" in out.stderr
  assert "ncjax: error:" not in out.stderr


@pytest.mark.multiprocess
def test_two_processes_that_find_the_same_mistake_print_it_once(tmp_path):
  logs = str(tmp_path / "logs")
  codes = multiprocess.run(["train", "--config=clip:model=micro,batch=100", "--config.log.progress=False",
                            f"--workdir={tmp_path}/w"], processes=2, devices=4, log_dir=logs, timeout=300)
  text = multiprocess.logs(logs, tail=None)
  errors = [line for line in text.splitlines() if line.startswith("ncjax: error:")]
  assert codes == [6, 6], text[-3000:]
  assert len(errors) == 1 and "global batch size 100" in errors[0], text[-3000:]
  assert "Traceback" not in text
