"""Configs by name (package data, found from any directory), paths to config files, and one-line errors for a
misspelt config argument or `--config.KEY` override.

The CLI cases run its `main(argv)` in this process (tests/cli_in_process.py), the misspelt override through a real
`python -m ncjax.main` as well: stderr holding that one line and nothing else is a property of the process."""

import os
import subprocess
import sys

import pytest

import cli_in_process
from helpers import ROOT
from ncjax import config_lib


def _cli(*args, cwd):
  return cli_in_process.run(list(args), cwd=str(cwd))


def _real_cli(*args, cwd):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "ncjax.main", *args], cwd=cwd, capture_output=True, text=True,
                        timeout=120, env=env)


def test_shipped_configs_are_package_data():
  import setuptools
  assert os.path.isfile(os.path.join(ROOT, "ncjax", "configs", "clip.py"))
  assert "ncjax.configs" in setuptools.find_packages(ROOT, include=["ncjax", "ncjax.*"])
  assert {"clip", "gsc", "ncu", "ncbench", "siglip"} <= set(config_lib.config_names())
  # the repository root keeps its configs/ path
  assert os.path.samefile(os.path.join(ROOT, "configs", "clip.py"), os.path.join(config_lib.CONFIGS_DIR, "clip.py"))


def test_a_config_is_found_by_name_by_its_root_path_and_by_any_path_from_any_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert config_lib.load_config_spec("clip:model=small,noise=0.4").model.size == "small"
  assert config_lib.load_config_spec("configs/gsc.py:noise=0.2").method.name == "gsc"   # no configs/ here
  mine = tmp_path / "mine.py"
  mine.write_text("from ncjax import config_lib\n\ndef get_config(arg=None):\n"
                  "  c = config_lib.base_config()\n  c.seed = int(arg or 7)\n  return c\n")
  assert config_lib.load_config_spec("mine.py").seed == 7
  assert config_lib.load_config_spec(f"{mine}:3").seed == 3


def test_config_errors_name_what_exists():
  with pytest.raises(config_lib.ConfigError, match=r"no shipped config 'clipp'; did you mean clip"):
    config_lib.find_config_file("clipp")
  with pytest.raises(config_lib.ConfigError, match=r"no config file 'elsewhere/clip2.py'"):
    config_lib.find_config_file("elsewhere/clip2.py")
  with pytest.raises(config_lib.ConfigError, match=r"--config=clip:modle=x: unknown config argument 'modle'"):
    config_lib.load_config_spec("clip:modle=x")


def test_closest_keys_of_a_misspelt_override():
  cfg = config_lib.load_config_file("clip")
  config_lib.check_override_path(cfg, "optim.lr")   # exists: no error
  config_lib.check_override_path(cfg, "evals.zeroshot.templates")
  with pytest.raises(config_lib.ConfigError, match=r"no key 'optim.lrr'; closest known keys: optim.lr\b"):
    config_lib.check_override_path(cfg, "optim.lrr")
  with pytest.raises(config_lib.ConfigError, match=r"no key 'optm'; closest known keys: optim.lr"):
    config_lib.check_override_path(cfg, "optm.lr")
  # a key given in the wrong section is found by its last part
  assert config_lib.closest_keys(cfg, "tensorboard")[0] == "log.tensorboard"


def test_cli_finds_configs_by_name_from_another_directory_and_errors_in_one_line(tmp_path):
  # train, eval and ncbench load --config by name from a directory without configs/ (the command then stops at
  # its next missing flag: the config loaded)
  out = _cli("train", "--config=clip:model=small,noise=0.4", cwd=tmp_path)
  assert out.returncode == 2 and out.stderr.strip() == "ncjax: error: --workdir is required", out.stderr[-2000:]
  out = _cli("ncbench", "--config=ncbench:noise=0.2+0.4,seeds=1", cwd=tmp_path)
  assert out.returncode == 2 and out.stderr.strip() == "ncjax: error: --workdir is required", out.stderr[-2000:]
  out = _cli("eval", "--config=configs/clip.py:model=micro", cwd=tmp_path)
  assert out.returncode == 2 and "ncjax: error: eval needs --checkpoints" in out.stderr, out.stderr[-2000:]
  # a misspelt override: one line naming the key and the closest known ones (was a 40-line traceback), in this
  # process and from a real one
  expected = ["ncjax: error: --config.optim.lrr: the config has no key 'optim.lrr'; closest known keys: optim.lr, "
              + ", ".join(config_lib.closest_keys(config_lib.load_config_file("clip"), "optim.lrr")[1:])]
  for cli in (_cli, _real_cli):
    out = cli("train", "--config=clip", "--config.optim.lrr=4", "--workdir=x", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == expected, (cli.__name__, out.stderr[-2000:])
  # a misspelt k=v argument and an unknown config name: one line each
  for spec, expected in (("clip:modle=tiny", "unknown config argument 'modle'"),
                         ("clipp:model=tiny", "no shipped config 'clipp'")):
    out = _cli("train", f"--config={spec}", "--workdir=x", cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and expected in out.stderr, out.stderr
