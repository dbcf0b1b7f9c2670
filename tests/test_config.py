import os
import subprocess
import sys

import pytest

from helpers import ROOT, load_config
from ncjax.config_lib import parse_arg


def test_arg_string_sets_values_with_types():
  c = load_config("clip", "model=small,noise=0.2,batch=512,bf16=true")
  assert c.model.size == "small" and c.noise.ratio == 0.2 and c.noise.kind == "caption_shuffle"
  assert c.input.global_batch_size == 512 and c.model.dtype == "bfloat16"


def test_unknown_arg_names_the_key():
  with pytest.raises(ValueError, match=r"unknown config argument 'modle'.*known arguments"):
    load_config("clip", "modle=tiny")


def test_bad_value_type_is_an_error():
  with pytest.raises(ValueError):
    parse_arg("n=abc", n=3)
  with pytest.raises(ValueError, match="expects a boolean"):
    parse_arg("flag=maybe", flag=False)


def test_config_is_locked_against_unknown_keys():
  c = load_config("clip")
  with pytest.raises(AttributeError, match="optim.lrr|lrr"):
    c.optim.lrr = 1.0


def test_cli_override_of_unknown_key_fails_naming_it(tmp_path):
  out = subprocess.run([sys.executable, "-m", "ncjax.main", "--config=configs/clip.py", f"--workdir={tmp_path}",
                        "--config.optim.lrr=0.1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode != 0
  assert "lrr" in out.stderr


def test_cli_requires_workdir_and_rejects_unknown_command():
  out = subprocess.run([sys.executable, "-m", "ncjax.main", "--config=configs/clip.py"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode != 0 and "--workdir is required" in out.stderr
  out = subprocess.run([sys.executable, "-m", "ncjax.main", "fly", "--config=configs/clip.py", "--workdir=/tmp/x"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode != 0 and "unknown command 'fly'" in out.stderr


@pytest.mark.parametrize("name", sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "configs"))
                                        if f.endswith(".py") and not f.startswith("_")))
def test_every_config_file_loads(name):
  c = load_config(name)
  assert c.method.name
