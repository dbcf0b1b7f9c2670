"""Starting runs from pretrained checkpoints, exporting them back, and evaluating an imported model directly."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
# torch is a test dependency (setup.cfg's `test` extra): missing, this module fails to import and `make test` fails,
# instead of skipping its parity tests and passing.
import torch

import data_fixtures as fx
import recompute
import reference_models as rm
from helpers import ROOT, leaves, make_config, tiny_clip_config
from ncjax import checkpoint as ckpt_lib, config_lib, train
from ncjax import pretrained


@pytest.fixture(scope="module")
def openai_checkpoint(tmp_path_factory):
  """A reduced random CLIP saved in OpenAI's layout (16 px images, 4 px patches, 1 + 1 layers of width 128: the
  NCU run below compiles its towers unrolled, and a layer more adds nothing the import's parity tests do not check)."""
  ref = rm.make_open_clip(rm.tiny_open_clip_cfg(True, image_size=16, patch=4, vlayers=1, tlayers=1))
  path = str(tmp_path_factory.mktemp("openai") / "ViT-tiny.pt")
  torch.save(ref.state_dict(), path)
  return path, ref


@pytest.fixture(scope="module")
def ncu_run(openai_checkpoint, tmp_path_factory):
  path, _ = openai_checkpoint
  # One step of 16: the paper preset's bf16 towers run slowly on XLA:CPU at the suite's -O0, and a step more or
  # larger proves nothing more about the start from the checkpoint or the export.
  cfg = make_config("ncu", f"setting=paper,init=openai:{path},data=digits,batch=16,epochs=1,epochs_prompt=1",
                    total_steps=1)
  workdir = str(tmp_path_factory.mktemp("ncu_paper"))
  trainer = train.Trainer(cfg, workdir)
  # The parameters the run starts from, fetched as the run itself creates them: a second init to look at would cost
  # as much again (the random init of the 49,408-token embedding runs ~10 s on XLA:CPU at -O0).
  init, create = {}, trainer.init_params
  trainer.init_params = lambda: _fetched(create(), into=init)
  result = trainer.run()
  assert init, "the run did not create its parameters through Trainer.init_params"
  return workdir, init, result


def _fetched(params, into: dict):
  into.update(leaves(params))   # before the first step donates them
  return params


def test_ncu_paper_setting_starts_from_an_openai_checkpoint(openai_checkpoint, ncu_run):
  path, _ = openai_checkpoint
  workdir, init, result = ncu_run
  _, loaded = pretrained.load(f"openai:{path}")
  for key, value in leaves(loaded).items():   # every tower parameter starts from the checkpoint
    np.testing.assert_array_equal(init[f"model/{key}"], value, err_msg=key)
  assert "prompt/ctx" in init and np.isfinite(result.metrics["loss"])
  meta = ckpt_lib.read_source_meta(workdir)
  assert meta["tokenizer"]["kind"] == "clip_bpe" and meta["config"]["model"]["pretrained"] == f"openai:{path}"
  assert meta["config"]["model"]["size"] == "custom" and meta["config"]["model"]["image_width"] == 128
  assert meta["config"]["model"]["dtype"] == "bfloat16"   # the paper preset's compute dtype is kept


def _run_cli(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, "-m", "ncjax.main", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


def _run_command_in_process(*args) -> None:
  """`ncjax ARGS` through the CLI's own flag parsing and dispatch, in this process (a fresh process adds nothing the
  CLI tests in their own processes do not check); the global flags are reset after."""
  from absl import flags
  from ncjax.cli import main
  try:
    main._dispatch(main._parse_flags(["ncjax", *args]))   # noqa: SLF001 — main() would os._exit on a user error
  finally:
    flags.FLAGS.unparse_flags()


def test_export_command_writes_a_folder_open_clip_loads(ncu_run, tmp_path, capsys):
  workdir, _, result = ncu_run
  out = str(tmp_path / "exported")
  _run_command_in_process("export", f"--checkpoint={workdir}", "--format=open_clip", f"--output={out}")
  printed = capsys.readouterr().out
  assert "local-dir:" in printed
  images, tokens = rm.images_and_tokens(size=16)
  em = result.experiment.method.eval_model(result.params)
  import jax
  ours = np.asarray(jax.jit(em.encode_image)(images)), np.asarray(jax.jit(em.encode_text)(tokens))
  back = rm.import_open_clip().create_model(f"local-dir:{out}").eval()
  with torch.no_grad():
    ref = (rm.normalise(back.encode_image(rm.torch_nchw(images)).numpy()),
           rm.normalise(back.encode_text(torch.from_numpy(tokens.astype(np.int64))).numpy()))
  for a, b in zip(ours, ref):   # bf16 towers in the run: compare in float32 against open_clip's float32
    assert np.min(np.sum(a * b, -1)) > 0.999


@pytest.mark.slow   # make test-all (31 s); make test evaluates a pretrained model in cli/test_eval_suite.py
def test_eval_init_evaluates_an_imported_model_on_an_image_folder(openai_checkpoint, tmp_path):
  path, _ = openai_checkpoint
  root = fx.write_image_folder(str(tmp_path / "imgs"), size=20)
  out = str(tmp_path / "eval_out")
  _run_cli("eval", f"--init=openai:{path}", "--config=configs/clip.py", f"--output={out}", "--cpu_devices=8",
           f"--config.evals.zeroshot.dataset=image_folder:{root}", "--config.evals.zeroshot.templates=imagenet7")
  with open(os.path.join(out, "eval", "step_0.json")) as f:
    report = json.load(f)
  zs = report["results"]["zeroshot"]
  # 3 classes: top-5 is undefined, written as null (never a bare NaN in JSON)
  assert report["init"] == f"openai:{path}" and zs["acc5"] is None
  # top-1 recomputed here: the 6 test images and OpenAI's 7 ImageNet prompts through load_model, CLIP's prompt
  # ensemble restated (tests/recompute.py)
  from ncjax import data as data_lib
  from ncjax.evals.zeroshot import templates_for
  model, _, tokenizer = pretrained.load_model(f"openai:{path}")
  split = data_lib.load_split(data_lib.InputSpec(dataset=f"image_folder:{root}"), "test", 16)
  assert split.num_images == 6
  img = np.asarray(model.encode_image(np.asarray(data_lib.eval_images(split, 16, "openai")[np.arange(6)])))
  weights = recompute.zero_shot_weights(model, tokenizer, split.class_names, templates_for("imagenet7"), jit=False)
  assert zs["acc1"] == pytest.approx(np.mean((img @ weights.T).argmax(1) == split.image_labels), abs=1e-9)
  assert "noise_detection" not in report["results"] and "retrieval" in report["results"]
  assert {r["dataset"] for r in report["records"]} == {f"image_folder:{root}", "digits"}


def test_a_run_with_context_16_exports_and_loads_back_with_a_tokenizer_of_16(tmp_path):
  """A run's checkpoint -> export (open_clip) -> load_model -> encode_text(tokenizer(captions)) for a context other
  than 77.

  Until 2026-11-23 the tokenizer load_model returned padded to 77 whatever the model's context, and the model then
  refused its tokens ("text tower expects tokens of shape (batch, 16), got (3, 77)"). open_clip's own tokenizer of
  the exported folder is the independent reference for the ids."""
  workdir, out = tmp_path / "run", tmp_path / "exported"
  # The run's checkpoint as its trainer writes it, before a first step: a step changes nothing the export, the
  # tokenizer or the context is made of (and compiles the run's step, the costliest program here). On one device:
  # nothing here depends on the device count, and the initialisation (a 49,408-token embedding) compiles for one
  # device in less time than split over eight.
  import jax
  trainer = train.Trainer(tiny_clip_config(total_steps=1, **{"model.tokenizer": "clip_bpe"}), str(workdir),
                          devices=jax.devices()[:1])
  state, span = trainer.restore_or_init()
  trainer.save(state, 0, span, force=True)
  trainer.checkpointer.wait()
  run_tokenizer = trainer.exp.tokenizer
  assert run_tokenizer.kind == "clip_bpe" and run_tokenizer.context_length == 16
  params, meta, _ = ckpt_lib.restore_params(str(workdir))   # what `ncjax export` does (ncjax/cli/main.py)
  config = config_lib.from_json_dict(meta["config"])
  pretrained.export(params["model"], config.model, str(out), "open_clip", tokenizer_kind=meta["tokenizer"]["kind"],
                    normalization=config.input.normalization)
  model, _, tokenizer = pretrained.load_model(f"open_clip:{out}")
  captions = ["a handwritten three", "a heavy, slanted seven written wide", "zero " * 30]   # the last is truncated
  tokens = tokenizer(captions)
  assert tokens.shape == (3, 16) and tokenizer.context_length == 16
  np.testing.assert_array_equal(tokens, rm.import_open_clip().get_tokenizer(f"local-dir:{out}")(captions).numpy())
  np.testing.assert_array_equal(tokens, run_tokenizer.encode(captions))
  em = trainer.exp.method.eval_model(state["params"])
  ours = np.asarray(jax.jit(em.encode_text)(run_tokenizer.encode(captions)))
  np.testing.assert_allclose(np.asarray(model.encode_text(tokens)), ours, atol=1e-6, rtol=0)   # measured 1.9e-7
