"""Injected noise on web data in the cases the earlier passes missed: a mixture read per pair draws a noisy caption's
partner from its own dataset, as block reads do (one protocol in every read mode); block reads deal a window across
an epoch's end with no pair twice in a global batch and no noisy caption beside its own image, on any process
count; a window too short for that deal says so in one warning; BlockNoise keeps a partner of its own block only
where its docstring says."""

import logging
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from helpers import make_config  # noqa: E402
from ncjax import experiment  # noqa: E402
from ncjax.data.noise import BlockNoise, PermutedNoise, _spread  # noqa: E402
from ncjax.data.web import dataset as web  # noqa: E402
from ncjax.data.web import index as web_index  # noqa: E402
from ncjax.data.web import pipeline as web_pipeline  # noqa: E402
from ncjax.data.web import synthetic as web_synthetic  # noqa: E402


def _fake_datasets(sizes):
  """Datasets of these sizes that are never read (the order and the noise need only their counts)."""
  return [web.WebDataset(f"/nowhere/{d}", [f"/nowhere/{d}/0.tar"], [n], index=object()) for d, n in enumerate(sizes)]


def test_a_mixture_read_per_pair_shows_a_noisy_caption_an_image_of_its_own_dataset(tmp_path):
  # before issue 53, 31.8% of a per-pair mixture's noisy captions were shown the other dataset's image (block reads:
  # none): the same config gave other noise on local disk (per pair by default) and on gs:// (blocks by default)
  roots = [str(tmp_path / "a"), str(tmp_path / "b")]
  for seed, (root, sizes) in enumerate(zip(roots, ([300, 400], [200, 150]))):
    web_synthetic.write_img2dataset(root, 0, shard_sizes=sizes, image_size=8, pool=2, seed=seed)
    web_index.build_index(root, workers=1)
  for read in ("pair", "block"):
    cfg = make_config("clip", f"data=web:{roots[0]}::{roots[1]},noise=0.4,batch=40",
                      **{"input.web.read": read, "input.web.block": 16})
    r = experiment.resolve(cfg)
    data, _ = web_pipeline.train_data(r.input, r.noise, r.concept, r.tokenizer, image_size=8, mesh=None)
    assert data.read == read
    ids = np.arange(data.num_examples)
    image = data.noise.image_of(ids)
    noisy = image != ids
    assert ((image < 700) == (ids < 700)).all(), read                # the partner: of the caption's own dataset
    assert [p.num_noisy for p in data.noise.parts] == [280, 140]      # floor(0.4 N_d) of each dataset drawn ...
    assert 275 <= noisy[:700].sum() <= 280 and 135 <= noisy[700:].sum() <= 140   # (NCR's few fixed points)
    np.testing.assert_array_equal(data.noise.holder_of(image), ids)
  single = PermutedNoise(700, 0.4, 3)
  assert single.per_dataset([700]) is single                         # one dataset: the noise it always had


@pytest.mark.parametrize("sizes,per_process,processes,noise", [
    ([10_000], 256, 2, True), ([7_000, 3_000], 256, 2, True), ([2_000], 40, 4, True), ([1_000], 64, 1, True),
    ([10_000], 256, 2, False)])
def test_windows_across_an_epochs_end_put_no_pair_twice_nor_beside_its_own_image(sizes, per_process, processes,
                                                                                  noise):
  # before issue 53: 214 pairs twice in a global batch over 4 epochs of the first case, and 65 noisy captions beside
  # their own image (0.4%), all in windows that held the end of one epoch and the start of the next
  n = sum(sizes)
  parts = [web_pipeline.WebTrainData(_fake_datasets(sizes), None, per_process * processes, 0, None, read="block",
                                     noise=PermutedNoise(n, 0.4, seed=3) if noise else None, process_index=p,
                                     process_count=processes) for p in range(processes)]
  data = parts[0]
  G = data.steps_per_window
  span = G * data.global_batch_size

  def crosses(w):   # the window's positions hold the end of one epoch of a dataset and the start of the next
    first, last = data.mixture.consumed(0, w * span), data.mixture.consumed(0, (w + 1) * span)
    return bool(np.any(first // data.sizes != (last - 1) // data.sizes))

  windows = range(4 * data.steps_per_epoch // G)
  assert G >= 12 and sum(map(crosses, windows)) >= 3
  twice = own = 0
  for w in windows:
    for s in range(w * G, (w + 1) * G):
      ids = np.concatenate([parts[p].order.local_ids(s, p) for p in range(processes)])
      twice += len(ids) - len(np.unique(ids))
      if noise:
        noisy = data.noise.image_of(ids) != ids
        own += int(np.isin(data.noise.holder_of(ids[noisy]), ids).sum())
    window = np.concatenate([parts[p].order.window_share(w, p)[0] for p in range(processes)])
    dealt = np.concatenate([parts[p].order.local_ids(s, p) for p in range(processes)
                            for s in range(w * G, (w + 1) * G)])
    assert sorted(dealt.tolist()) == sorted(window.tolist())         # the window's pairs, each dealt once
  assert twice == 0 and own == 0, (twice, own)


def test_a_window_too_short_to_separate_own_images_says_so_in_one_warning(caplog):
  # at 2 or fewer steps per epoch the deal cannot work (18% of noisy captions beside their own image) and nothing
  # said so
  with caplog.at_level(logging.WARNING, logger="ncjax"):
    data = web_pipeline.WebTrainData(_fake_datasets([100]), None, 40, 0, None, read="block",
                                     noise=PermutedNoise(100, 0.4, seed=3), process_index=0, process_count=1)
  assert data.steps_per_window == 2
  warned = [r.getMessage() for r in caplog.records if "too short for the deal" in r.getMessage()]
  assert len(warned) == 1 and "an epoch is only 2 batch(es) of 40 pairs" in warned[0], warned
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="ncjax"):
    web_pipeline.WebTrainData(_fake_datasets([1000]), None, 40, 0, None, read="block",
                              noise=PermutedNoise(1000, 0.4, seed=3), process_index=0, process_count=1)
  assert not [r for r in caplog.records if "too short for the deal" in r.getMessage()]


@pytest.mark.parametrize("n", [453, 1_000_003, 10_000, 1000])
def test_block_noise_keeps_a_partner_of_a_captions_own_block_only_where_its_docstring_says(n):
  # the docstring said at most one caption per dataset: 24 were counted at n = 453 and 21 at n = 1,000,003
  noise = BlockNoise(n, 0.4, seed=2, block=64)
  last = noise.num_units - 1
  for g in sorted({0, 1, last - 1, last} | set(range(0, noise.num_units, max(1, noise.num_units // 50)))):
    ids, image, _ = noise._group(g)                                  # noqa: SLF001
    same = int(((image // 64 == ids // 64) & (image != ids)).sum())
    sizes = np.bincount(ids // 64)[np.unique(ids // 64)]
    t = min(noise._count(g), len(ids))                               # noqa: SLF001
    take = sorted(_spread(t, sizes.tolist()), reverse=True) if t >= 2 else [0, 0]
    bound = take[0] - take[1]                                        # the docstring's bound: a block's surplus
    assert same <= bound, (g, same, bound, take)
    if g < last and len(sizes) == 2 and sizes.tolist() == [64, 64]:
      assert same <= 1                                               # a regular group: at most one
