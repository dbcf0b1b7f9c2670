"""`ncjax train` on img2dataset output (input.dataset='web:ROOT'): a mixture of two datasets with resampled shards,
streamed, stopped and resumed bitwise, and refused a resume once a shard was rewritten; indexed, with NCR's
caption-shuffle noise computed on demand."""

import jax
import numpy as np
import pytest

from helpers import tiny_clip_config
from ncjax import train
from ncjax.data.web import decode as web_decode
from ncjax.data.web import index as web_index
from ncjax.data.web import synthetic as web_synthetic


@pytest.fixture(scope="module")
def webdata(tmp_path_factory):
  base = tmp_path_factory.mktemp("webtrain")
  # the mixture (b and c) holds as many pairs as a: every run here has 20 steps an epoch, the steps' one compile
  roots = [str(base / "a"), str(base / "b"), str(base / "c")]
  web_synthetic.write_img2dataset(roots[0], 640, per_shard=80, image_size=24, pool=16, corrupt_images=(7,))
  web_synthetic.write_img2dataset(roots[1], 320, per_shard=80, image_size=24, pool=16, seed=1)
  web_synthetic.write_img2dataset(roots[2], 320, per_shard=80, image_size=24, pool=16, seed=2)
  return roots


def _config(dataset, **kw):
  return tiny_clip_config(arg="batch=32,epochs=1", total_steps=4, **{"input.dataset": dataset,
                                                                      "input.web.window": 2, **kw})


def _assert_equal(a, b):
  for x, y in zip(jax.tree.leaves(jax.device_get(a)), jax.tree.leaves(jax.device_get(b))):
    np.testing.assert_array_equal(x, y)


def test_a_streamed_resampled_mixture_resumes_bitwise_and_not_after_a_shard_was_rewritten(webdata, tmp_path):
  # one streamed run of a two-dataset mixture (resampled shards, weighted 1:3) answers three claims: its composition,
  # its resume (bitwise), and a resume refused once a shard it read was rewritten in place of the same name
  import os
  import shutil
  from ncjax import config_lib, errors
  first = str(tmp_path / "c")   # (a copy: a shard of it is rewritten below)
  shutil.copytree(webdata[2], first)
  cfg = _config(f"web:{first}::{webdata[1]}", **{"input.web.weights": "1::3", "input.web.mode": "stream",
                                                  "input.web.resample": True, "input.web.mix_block": 32})
  # the runs compared in memory save nothing (~0.5 s a save); the run stopped at step 2 saves there
  unsaved = config_lib.set_dotted(cfg.copy_and_resolve_references(), {"ckpt.save_at_end": False})
  full = train.train(unsaved, str(tmp_path / "full"))
  data = full.experiment.train_data
  assert data.mode == "stream" and data.num_examples == 640 and int(full.state["step"]) == 4
  comp = data.iterator_state(4)["composition"]
  assert [c["pairs_read"] for c in comp.values()] == [32, 96]
  train.train(cfg, str(tmp_path / "resumed"), until=2)
  shutil.copytree(tmp_path / "resumed", tmp_path / "resumed_after_rewrite")   # the same checkpoint at step 2
  resumed = train.train(unsaved, str(tmp_path / "resumed"))
  assert int(resumed.state["step"]) == 4
  _assert_equal(full.state, resumed.state)
  # the same count of pairs, captions rotated (a re-crawl): before 2026-11-26 the resume trained on them, exit 0
  web_synthetic.write_img2dataset(str(tmp_path / "other"), 320, per_shard=80, image_size=24, pool=16, seed=7)
  shutil.copy(os.path.join(tmp_path / "other", "00002.tar"), os.path.join(first, "00002.tar"))
  with pytest.raises(errors.CheckpointError, match=r"cannot resume .*00002.tar changed \(size:version then"):
    train.train(cfg, str(tmp_path / "resumed_after_rewrite"))


def test_indexed_web_training_with_on_demand_noise(webdata, tmp_path):
  web_index.build_index(webdata[0], workers=1)
  cfg = _config(f"web:{webdata[0]}", **{"noise.kind": "caption_shuffle", "noise.ratio": 0.4,
                                         "ckpt.save_at_end": False})   # (read in memory: no save)
  result = train.train(cfg, str(tmp_path / "noisy"))
  data = result.experiment.train_data
  assert data.mode == "index" and data.noise is not None and result.experiment.noisy is None
  assert 250 <= (~data.noise.clean(np.arange(640))).sum() <= 256     # floor(0.4 * 640) chosen, a few keep theirs
  ds = data.datasets[0]
  shown_noisy = 0
  for s in range(4):   # what the loss saw: each caption with the noise's image, flagged (diagnostics only)
    batch = data.host_batch(s)
    partners = data.noise.image_of(batch["id"])
    np.testing.assert_array_equal(batch["clean"], partners == batch["id"])
    drawn = data.indices(s)
    for k, (gid, partner) in enumerate(zip(batch["id"], partners)):
      own, shown = ds.read(int(gid)), ds.read(int(partner))
      if gid != drawn[k] or own.bad or shown.bad:
        continue   # a bad record's slot repeats the next usable pair (the corrupt image of pair 7)
      # the partner's image bytes (read here by id), made with this position's crop, and the pair's own caption
      spec = web_decode.ExampleSpec(int(gid), own.caption, shown.image, (cfg.input.shuffle_seed, s, k))
      image, tokens = web_decode.make_example(spec, data.settings, data.tokenizer)
      np.testing.assert_array_equal(batch["image"][k], image)
      np.testing.assert_array_equal(batch["tokens"][k], tokens)
      shown_noisy += partner != gid
  assert shown_noisy >= 20


@pytest.mark.slow   # (make test keeps tests/data/test_web_io.py's SkipGuard test; this is the same through train)
def test_a_run_whose_bad_records_exceed_max_skipped_fraction_stops_with_one_line(tmp_path):
  from ncjax import errors
  root = str(tmp_path / "broken")
  web_synthetic.write_img2dataset(root, 320, per_shard=80, image_size=24, pool=16,
                                  corrupt_images=tuple(range(0, 320, 4)))   # a quarter of the images do not decode
  cfg = _config(f"web:{root}", **{"input.web.mode": "stream", "input.web.max_skipped_fraction": 0.1})
  with pytest.raises(errors.DataError, match=r"of the \d+ web pairs read since the run started were bad records .*"
                                             r"input.web.max_skipped_fraction=0.1") as raised:
    train.train(cfg, str(tmp_path / "run"))
  assert "\n" not in str(raised.value)                               # one line (the CLI prints it as it is)
