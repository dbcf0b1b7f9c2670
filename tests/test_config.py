import os

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
  import cli_in_process
  out = cli_in_process.run(["--config=configs/clip.py", f"--workdir={tmp_path}", "--config.optim.lrr=0.1"], cwd=ROOT)
  assert out.returncode != 0
  assert "lrr" in out.stderr


def test_cli_requires_workdir_and_rejects_unknown_command():
  # in this process (tests/cli_in_process.py): a real `python -m ncjax.main` that refuses its input is
  # tests/cli/test_errors.py's
  import cli_in_process
  out = cli_in_process.run(["--config=configs/clip.py"], cwd=ROOT)
  assert out.returncode != 0 and "--workdir is required" in out.stderr
  out = cli_in_process.run(["fly", "--config=configs/clip.py", "--workdir=/tmp/x"], cwd=ROOT)
  assert out.returncode != 0 and "unknown command 'fly'" in out.stderr


@pytest.mark.parametrize("name", sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "configs"))
                                        if f.endswith(".py") and not f.startswith("_")))
def test_every_config_file_loads(name):
  c = load_config(name)
  if name == "ncbench":    # a sweep over methods, not one run
    from ncjax.cli import ncbench
    assert c.bench.methods and set(c.bench.methods) <= set(ncbench.methods())
    return
  assert c.method.name


def test_optional_arguments_keep_their_type_and_default_to_none():
  from ncjax.config_lib import optional
  a = parse_arg("batch=64", batch=optional(int), noise=optional(float), name=optional(str))
  assert a.batch == 64 and a.noise is None and a.name is None
  with pytest.raises(ValueError, match="'batch' expects int, got 'big'"):
    parse_arg("batch=big", batch=optional(int))


def test_presets_lie_under_the_users_arguments():
  from ncjax.config_lib import with_preset
  a = parse_arg("batch=64", batch=optional_int(), lr=optional_float())
  merged = with_preset(a, {"small": dict(batch=8, lr=0.1, extra="x")}, "small")
  assert (merged.batch, merged.lr, merged.extra) == (64, 0.1, "x")
  with pytest.raises(ValueError, match=r"unknown preset 'huge'; presets: \['small'\]"):
    with_preset(a, {"small": {}}, "huge")
  paper = load_config("ncu", "setting=paper,batch=1024")
  assert paper.input.global_batch_size == 1024 and paper.model.size == "ViT-B/16" and paper.method.epochs_prompt + paper.num_epochs == 2 + 8
  digits = load_config("ncu", "epochs_prompt=0")
  assert digits.method.epochs_prompt == 0 and digits.noise.ratio == 0.4


def optional_int():
  from ncjax.config_lib import optional
  return optional(int)


def optional_float():
  from ncjax.config_lib import optional
  return optional(float)


def test_demo_workdirs_pass_through_a_config_argument():
  """The demo starts unlearning rows from earlier rows' workdirs via 'init=PATH': a comma in a row name's
  workdir would split the argument (it broke `make demo` once)."""
  from ncjax.cli import demo
  names = [row[0] for row in demo.CONCEPT_START + demo.CONCEPT_ROWS + demo.REGION_ROWS]
  for name in names:
    path = demo._workdir(name)
    assert parse_arg(f"variant=all,init={path}", variant="", init="").init == path


@pytest.mark.parametrize("name", ["ncu", "gsc", "bayes", "sgraf", "disncl"])
def test_injected_noise_defaults_to_zero_on_a_users_dataset(name):
  from helpers import load_config
  embedded = load_config(name, "")
  assert embedded.noise.kind == "caption_shuffle" and embedded.noise.ratio == 0.4
  own = load_config(name, "data=tfds:web_pairs/custom_table")
  assert own.noise.kind == "none" and own.noise.ratio == 0.0
  asked = load_config(name, "data=tfds:web_pairs/custom_table,noise=0.2")
  assert asked.noise.kind == "caption_shuffle" and asked.noise.ratio == 0.2


def test_the_input_specs_defaults_are_the_configs_and_every_key_has_a_field():
  # The data layer takes typed specs (ncjax.data.specs) built by experiment.resolve; a spec built by hand (tests,
  # tools) must mean what the config's defaults mean, and a config key without a field would be dropped silently.
  import dataclasses
  from ncjax import config_lib, experiment
  from ncjax.data.specs import ConceptSpec, InputSpec, NoiseSpec, WebSpec
  base = config_lib.base_config()
  web = base.input.web.to_dict()
  plain = {k: v for k, v in base.input.to_dict().items() if k != "web"}
  for cls, section in ((InputSpec, plain), (WebSpec, web), (NoiseSpec, base.noise.to_dict()),
                       (ConceptSpec, base.concept.to_dict())):
    fields = {f.name: f.default for f in dataclasses.fields(cls) if f.name != "web"}
    assert set(fields) == set(section), cls.__name__
    assert {k: tuple(v) if isinstance(v, list) else v for k, v in section.items()} == fields, cls.__name__
  assert experiment.input_spec(base.input) == InputSpec()
  resolved = experiment.resolve(load_config("clip", "data=digits,noise=0.3,batch=64"))
  assert resolved.input.global_batch_size == 64 and resolved.noise.ratio == 0.3
  assert resolved.noise.kind == "caption_shuffle" and resolved.tokenizer.context_length == resolved.model.context_length
  with pytest.raises(Exception, match=r"unknown input\.web keys \['modee'\]"):
    experiment.input_spec(dict(plain, web=dict(web, modee="index")))
