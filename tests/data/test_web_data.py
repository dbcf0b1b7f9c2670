"""Web-scale data (ncjax.data.web.dataset, permutation, mixture, web_pipeline): img2dataset output read streamed and indexed
with the same example ids, on-demand permutations and noise, exact resume, process slices, bad records, mixtures,
the parallel build. The fixture is a 3,200-pair tar + parquet dataset of 8-px JPEGs in 20 shards (tests/README:
synthetic, written by ncjax.data.web.synthetic): every claim here is about ids, orders and shards, none about size
(the on-demand permutation at web scale is its own test)."""

import json
import os

import numpy as np
import pytest

from ncjax.data import build
from ncjax.data.web import mixture
from ncjax.data.web import dataset as web
from ncjax.data.web import decode as web_decode
from ncjax.data.web import index as web_index
from ncjax.data.web import pipeline as web_pipeline
from ncjax.data.web import synthetic as web_synthetic
from ncjax.data.noise import PermutedNoise, make_noisy_index
from ncjax.data.web.permutation import Permutation
from ncjax.data.pipeline import BadRecordError
from ncjax.data.specs import InputSpec, WebSpec
from ncjax.tokenizers import TokenizerSpec, WordTokenizer

N = 3_200          # 50 global batches of 64: step 50 is exactly the first of epoch 1
PER_SHARD = 160


@pytest.fixture(scope="module")
def web_pairs(tmp_path_factory):
  """3,200 pairs in 20 shards (tar + parquet + _stats.json), streamed-only copy and an indexed copy (same files)."""
  root = str(tmp_path_factory.mktemp("web_pairs") / "data")
  info = web_synthetic.write_img2dataset(root, N, per_shard=PER_SHARD, image_size=8, pool=16)
  return dict(root=root, info=info)


@pytest.fixture(scope="module")
def indexed_pairs(web_pairs):
  manifest = web_index.build_index(web_pairs["root"], workers=2)
  return dict(web_pairs, manifest=manifest)


def _tokenizer():
  return WordTokenizer.build(web_synthetic.captions(0, 200), context_length=12)


def _data(datasets, mode, batch=64, **kw):
  kw.setdefault("image_size", 8)
  kw.setdefault("num_threads", 2)
  kw.setdefault("process_index", 0)
  kw.setdefault("process_count", 1)
  return web_pipeline.WebTrainData(datasets, _tokenizer(), batch, 3, None, mode=mode, **kw)


# --- permutations and noise --------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 1000, 4097, 65_537])
def test_permutation_is_a_bijection_with_an_exact_inverse(n):
  p = Permutation(n, seed=7)
  values = p(np.arange(n))
  assert sorted(values.tolist()) == list(range(n))
  np.testing.assert_array_equal(p.inverse(values), np.arange(n))
  assert p(n - 1) == values[-1] and isinstance(p(0), int)
  if n >= 17:
    assert not np.array_equal(values, Permutation(n, seed=8)(np.arange(n)))        # another seed, another order
    assert not np.array_equal(values, Permutation(n, 7, 1)(np.arange(n)))          # another tag, another order
    assert (values != np.arange(n)).mean() > 0.8


def test_permutation_at_web_scale_is_on_demand():
  n = 400_000_000
  p = Permutation(n, seed=1)
  x = np.random.default_rng(0).integers(0, n, 10_000)
  y = p(x)
  assert y.min() >= 0 and y.max() < n and len(np.unique(y)) == len(np.unique(x))
  np.testing.assert_array_equal(p.inverse(y), x)
  with pytest.raises(IndexError):
    p(n)


@pytest.mark.parametrize("derangement", [False, True])
def test_permuted_noise_shuffles_the_images_of_a_chosen_subset(derangement):
  n, ratio = 5000, 0.3
  noise = PermutedNoise(n, ratio, seed=4, derangement=derangement)
  partner = noise.image_of(np.arange(n))
  assert sorted(partner.tolist()) == list(range(n))             # every image is shown exactly once
  moved = partner != np.arange(n)
  # floor(ratio n) captions are chosen; without derangement a few of them keep their own image (as NCR's)
  chosen = PermutedNoise(n, ratio, 4)._perms[0](np.arange(n)) < int(ratio * n)
  assert chosen.sum() == 1500 and not moved[~chosen].any()
  if derangement:
    assert moved.sum() == 1500
  else:
    assert 1490 <= moved.sum() < 1500
  # the same statistics as the N-long protocol of the small-data path
  small = make_noisy_index(np.arange(n), ratio, 4)
  assert abs(small.noisy_fraction - (~noise.clean(np.arange(n))).mean()) < 0.01
  assert noise.sha256 != PermutedNoise(n, ratio, 5).sha256 and noise.sha256 == PermutedNoise(n, ratio, 4,
                                                                                            derangement).sha256


# --- streamed and indexed: the same examples -------------------------------------------------------------------
def test_streamed_and_indexed_give_the_same_examples(indexed_pairs):
  root, info = indexed_pairs["root"], indexed_pairs["info"]
  assert indexed_pairs["manifest"]["num_examples"] == N and not indexed_pairs["manifest"]["bad_shards"]
  streamed = web.open_dataset(root, use_index=False)
  indexed = web.open_dataset(root)
  assert streamed.index is None and indexed.index is not None
  np.testing.assert_array_equal(streamed.counts, indexed.counts)
  seen = 0
  rng = np.random.default_rng(0)
  check = set(rng.integers(0, N, 2000).tolist()) | {0, N - 1, PER_SHARD - 1, PER_SHARD}
  for s in range(len(streamed.shards)):
    captions = web_synthetic.captions(s * PER_SHARD, PER_SHARD)     # what the writer put there
    for sample in streamed.iter_shard(s):
      assert not sample.bad
      assert sample.caption == captions[sample.id - s * PER_SHARD] and sample.image == info["image_of"](sample.id)
      if sample.id in check:
        other = indexed.read(sample.id)
        assert (other.id, other.key, other.caption, other.image, other.meta) == (
            sample.id, sample.key, sample.caption, sample.image, sample.meta)
      seen += 1
  assert seen == N
  # the parquet's successful rows are the tar's samples, in order (failed downloads are parquet-only rows)
  assert web.read_parquet_captions(streamed.shards[3])[:5] == [info["caption"](3 * PER_SHARD + k) for k in range(5)]


def test_an_epoch_visits_every_pair_once_streamed_and_indexed(indexed_pairs):
  root = indexed_pairs["root"]
  b = 400
  for mode, ds in (("stream", web.open_dataset(root, use_index=False)), ("index", web.open_dataset(root))):
    data = _data([ds], mode, batch=b, window=3, buffer=256)
    assert data.steps_per_epoch == N // b
    if mode == "index":
      ids = np.concatenate([data.indices(s) for s in range(data.steps_per_epoch)])
    else:
      ids = np.concatenate([b["id"] for b in data.host_batches(0, data.steps_per_epoch)])
    assert sorted(ids.tolist()) == list(range(N)), mode
    assert (np.abs(np.diff(ids)) > 1).mean() > 0.9        # shuffled, not read in file order


# --- resume, process slices -------------------------------------------------------------------------------------
def _batches(data, start, stop):
  return [dict(b) for b in data.host_batches(start, stop)]


@pytest.mark.parametrize("resample", [False, True])
def test_streamed_order_resumes_bitwise_mid_window(web_pairs, resample):
  ds = web.open_dataset(web_pairs["root"], use_index=False)
  make = lambda: _data([ds], "stream", batch=96, window=2, buffer=128, resample=resample)
  full = _batches(make(), 0, 24)          # 24 x 96 pairs: several windows of 2 shards (320 pairs)
  resumed = _batches(make(), 13, 24)      # a fresh reader, started inside the second window
  for a, b in zip(full[13:], resumed):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  ids = np.concatenate([b["id"] for b in full])
  assert len(np.unique(ids)) == len(ids) or resample


def test_two_processes_read_disjoint_slices_of_each_global_batch(indexed_pairs):
  root = indexed_pairs["root"]
  one = _data([web.open_dataset(root)], "index", batch=64)
  parts = [_data([web.open_dataset(root)], "index", batch=64, process_index=p, process_count=2) for p in range(2)]
  first_of_epoch_1 = N // 64     # (no window across the epoch's end, whose pairs a batch may then hold twice)
  for step in (0, 5, first_of_epoch_1, first_of_epoch_1 + 1):
    whole = one.host_batch(step)
    halves = [d.host_batch(step) for d in parts]
    assert not set(halves[0]["id"].tolist()) & set(halves[1]["id"].tolist())
    for k in ("image", "tokens", "id", "clean"):
      np.testing.assert_array_equal(np.concatenate([h[k] for h in halves]), whole[k], err_msg=k)
  # streamed: each process reads only its own shards (every second shard of each epoch's shard order)
  streamed = [_data([web.open_dataset(root, use_index=False)], "stream", batch=100, window=2, buffer=64,
                    process_index=p, process_count=2) for p in range(2)]
  per_epoch = N // 100
  ids = [np.concatenate([b["id"] for b in d.host_batches(0, per_epoch)]) for d in streamed]
  assert not set(ids[0].tolist()) & set(ids[1].tolist())
  assert sorted(np.concatenate(ids).tolist()) == list(range(N))
  shards = [set((i // PER_SHARD).tolist()) for i in ids]
  assert len(shards[0]) == len(shards[1]) == 10 and not shards[0] & shards[1]


# --- bad records --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("damaged") / "data")
  info = web_synthetic.write_img2dataset(root, 2000, per_shard=250, image_size=8, pool=8,
                                         corrupt_images=(5, 300, 301), truncate_shards=(3,))
  manifest = web_index.build_index(root, workers=1)
  return dict(root=root, info=info, manifest=manifest)


def test_a_cut_shard_and_corrupt_images_are_skipped_and_counted(damaged):
  root = damaged["root"]
  assert list(damaged["manifest"]["bad_shards"]) == ["00003.tar"]
  streamed = web.open_dataset(root, use_index=False)
  bad = [x.id for x in streamed.iter_shard(3) if x.bad]
  assert bad and bad[-1] == 999 and len(bad) == damaged["manifest"]["counts"][3] - len(
      [x for x in streamed.iter_shard(3) if not x.bad])
  assert web.open_dataset(root).read(bad[0]).bad        # the index knows the missing samples too
  run = len(bad)                                        # the consecutive ids the cut tar lost
  for mode, ds in (("stream", streamed), ("index", web.open_dataset(root))):
    data = _data([ds], mode, batch=100, window=8, buffer=64)
    skipped, ids = 0, []
    for b in data.host_batches(0, data.steps_per_epoch):
      skipped += int(b["_skipped"])
      ids.extend(b["id"].tolist())
    # each bad pair once, in both modes (its slot repeats the next usable pair of the batch): the cut run, id 5, and
    # ids 300-301
    assert skipped == run + 3, mode
    assert not {5, 300, 301} & set(ids) and not set(bad) & set(ids)
    raising = _data([data.datasets[0]], mode, batch=100, window=8, buffer=64, on_bad_record="raise")
    with pytest.raises(BadRecordError, match="bad training record id"):
      for _ in raising.host_batches(0, raising.steps_per_epoch):
        pass


def test_an_unreadable_root_and_a_shard_without_metadata_are_clear_errors(tmp_path):
  with pytest.raises(Exception, match=r"no WebDataset shards \(\*.tar\)"):
    web.open_dataset(str(tmp_path))
  web_synthetic.write_img2dataset(str(tmp_path / "d"), 30, per_shard=10, image_size=8, pool=2, parquet=False,
                                  stats=False)
  with pytest.raises(Exception, match="build the index once"):
    web.open_dataset(str(tmp_path / "d"))
  assert build.main(["--dataset=web", f"--manual_dir={tmp_path / 'd'}", "--workers=1"]) == 0
  assert web.open_dataset(str(tmp_path / "d")).num_examples == 30     # counted by the build
  with pytest.raises(ValueError, match="needs random access"):
    _data([web.open_dataset(str(tmp_path / "d"), use_index=False)], "stream", batch=10,
          noise=PermutedNoise(30, 0.2, 0))


# --- mixtures ------------------------------------------------------------------------------------------------------
def test_mixture_composition_is_exact_and_a_function_of_the_position():
  mix = mixture.Mixture((1.0, 3.0, 0.5), 90, seed=2)
  assert mix.counts.tolist() == [20, 60, 10]
  pos = np.arange(90 * 7 + 33)
  d, q = mix.choose(1, pos)
  for k in range(3):
    got = np.sort(q[d == k])
    np.testing.assert_array_equal(got, np.arange(len(got)))       # each dataset's ordinals 0, 1, 2, ... in turn
  np.testing.assert_array_equal(mix.consumed(1, len(pos)), np.bincount(d, minlength=3))
  for cut in (0, 45, 90, 400):   # any suffix, computed alone, continues it (what resume relies on)
    d2, q2 = mixture.Mixture((1.0, 3.0, 0.5), 90, seed=2).choose(1, pos[cut:])
    np.testing.assert_array_equal(d2, d[cut:])
    np.testing.assert_array_equal(q2, q[cut:])
  assert not np.array_equal(mix.choose(2, pos)[0], d)


def test_a_weighted_mixture_of_two_datasets_upsamples_and_logs_its_composition(tmp_path, caplog):
  roots = []
  for k, n in enumerate((300, 1200)):
    roots.append(str(tmp_path / f"d{k}"))
    web_synthetic.write_img2dataset(roots[-1], n, per_shard=100, image_size=8, pool=4, seed=k)
    web_index.build_index(roots[-1], workers=1)
  spec = _input_spec(f"web:{roots[0]}::{roots[1]}", weights="1::1", mix_block=100)
  datasets = web_pipeline.open_datasets(spec)
  import logging
  with caplog.at_level(logging.INFO, logger="ncjax"):
    data = _data(datasets, "index", batch=100, weights=spec.web.weights, mix_block=100)
  assert "50.00%" in caplog.text
  assert data.num_examples == 1500 and data.steps_per_epoch == 15
  ids = np.concatenate([data.indices(s) for s in range(15)])
  small = ids < 300
  assert small.sum() == 750                     # exactly half: the small dataset read 2.5 times
  assert np.bincount(ids[small], minlength=300).tolist() in ([2] * 300, [3] * 300) or \
      set(np.bincount(ids[small], minlength=300).tolist()) <= {2, 3}
  state = data.iterator_state(15)
  comp = state["composition"]
  assert [c["pairs_read"] for c in comp.values()] == [750, 750] and [c["share"] for c in comp.values()] == [.5, .5]
  json.dumps(state)
  # streamed with resampled shards: the same exact composition, and resumable
  streamed = [web.open_dataset(r, use_index=False) for r in roots]
  make = lambda: _data(streamed, "stream", batch=50, weights=(1, 1), mix_block=100, resample=True, window=2,
                       buffer=32)
  full = _batches(make(), 0, 8)
  ids = np.concatenate([b["id"] for b in full])
  assert (ids < 300).sum() == 200
  for a, b in zip(full[5:], _batches(make(), 5, 8)):
    np.testing.assert_array_equal(a["image"], b["image"])


def _input_spec(dataset, **web_overrides):
  return InputSpec(dataset=dataset, web=WebSpec(**web_overrides))


# --- the build ----------------------------------------------------------------------------------------------------
def test_a_build_over_two_hosts_equals_one_and_continues_after_an_interruption(web_pairs, tmp_path):
  root = web_pairs["root"]
  one = str(tmp_path / "one")
  web_index.build_index(root, index_dir=one, workers=1)
  two = str(tmp_path / "two")
  assert build.main(["--dataset=web", f"--manual_dir={root}", f"--index_dir={two}", "--num_hosts=2",
                     "--host_index=1", "--workers=2"]) == 0
  assert not os.path.exists(os.path.join(two, "manifest.json"))
  with pytest.raises(Exception, match="not indexed yet"):
    web_index.merge_index(root, two)
  assert build.main(["--dataset=web", f"--manual_dir={root}", f"--index_dir={two}", "--num_hosts=2",
                     "--host_index=0", "--workers=1"]) == 0
  assert build.main(["--dataset=web", f"--manual_dir={root}", f"--index_dir={two}", "--num_hosts=2",
                     "--merge"]) == 0
  manifest = web_index.read_manifest(one)
  assert manifest == web_index.read_manifest(two)
  for name in (manifest["offsets_file"], "manifest.json"):
    with open(os.path.join(one, name), "rb") as f, open(os.path.join(two, name), "rb") as g:
      assert f.read() == g.read(), name
  assert np.load(os.path.join(one, manifest["offsets_file"])).dtype == np.uint32     # 4 bytes per pair


def test_a_word_vocabulary_over_web_data_is_capped(web_pairs):
  spec = _input_spec(f"web:{web_pairs['root']}", vocab_captions=3000, max_vocab=60)
  datasets = web_pipeline.open_datasets(spec)
  tok = web_pipeline.web_tokenizer(TokenizerSpec("word", 16), spec.web, datasets)
  assert tok.vocab_size == 60
  assert web_pipeline.parse_roots("web:gs://b/x::/local/y") == ["gs://b/x", "/local/y"]
  assert web_pipeline.parse_weights("1::2.5", 2, (10, 20)) == (1.0, 2.5)


def test_a_web_run_whose_context_cuts_captions_says_what_share_it_cuts(web_pairs, caplog):
  """Web data keeps the context it is given; a context that cuts captions is a warning with the share cut, measured
  on the captions of the first shards (here all 3,200: 10-18 words, 12-20 tokens with start and end)."""
  import logging
  from helpers import make_config
  from ncjax.experiment import build_experiment
  from ncjax.tokenizers.word import split_words
  counts = np.asarray(web_pairs["info"]["counts"])
  caps = [c for start, n in zip(np.cumsum(counts) - counts, counts) for c in web_synthetic.captions(int(start), int(n))]
  tokens = np.asarray([len(split_words(c)) + 2 for c in caps])
  with caplog.at_level(logging.WARNING, logger="ncjax"):
    exp = build_experiment(make_config("clip", f"data=web:{web_pairs['root']},batch=64"))
  assert exp.tokenizer.context_length == 16                      # micro's, kept
  assert (f"model.context_length 16 cuts {np.mean(tokens > 16):.1%} of {N} captions sampled from the web data's "
          f"first shards (the longest: {tokens.max()} tokens)") in caplog.text
  assert 0 < np.mean(tokens > 16) < 1
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="ncjax"):
    build_experiment(make_config("clip", f"data=web:{web_pairs['root']},batch=64", **{"model.context_length": 24}))
  assert "cuts" not in caplog.text


def test_the_simplejpeg_decoder_crops_as_pil_does():
  import simplejpeg   # a test dependency (setup.cfg): a missing one fails, never skips
  assert simplejpeg
  from ncjax.data import streams
  jpeg = web_synthetic.jpeg_pool(1, 64, seed=3)[0]
  a = web_decode.decode_train(jpeg, 32, streams.crop_rng(0, 1, 2), "openai", (0.5, 1.0))
  b = web_decode.decode_train(jpeg, 32, streams.crop_rng(0, 1, 2), "openai", (0.5, 1.0), "simplejpeg")
  assert a.shape == b.shape == (32, 32, 3)
  assert np.abs(a - b).mean() < 0.02        # the same crop; the decoders' pixels differ by a level at most here


def test_the_table_normalisation_is_bitwise_the_small_data_paths():
  from ncjax.data import preprocess
  px = np.random.default_rng(0).integers(0, 256, (9, 7, 3)).astype(np.uint8)
  for name in ("openai", "imagenet", "siglip"):
    out = web_decode.normalize(px, name)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, preprocess.normalize(px, name))
