"""Kept subsets of web data (ncjax.data.web.subset) and the score files they are chosen from
(ncjax.data.web.score_files): rank / select / contains against numpy across superblock borders; the exact top fraction
(ties by id) and the threshold against a sort of every score, over all pairs and per dataset, bad records never
kept; a filter refused on data it was not chosen from; kept pairs written as img2dataset shards that read back."""

import json
import os

import numpy as np
import pytest

from ncjax import errors, fileio
from ncjax.data.web import dataset as web
from ncjax.data.web import index as web_index
from ncjax.data.web import score_files, subset
from ncjax.data.web import synthetic as web_synthetic


@pytest.mark.parametrize("n", [1, 9, 4095, 4096, 4097, 3 * 4096 + 17, 50_001])
@pytest.mark.parametrize("p", [0.0, 0.03, 0.7, 1.0])
def test_rank_select_and_contains_agree_with_numpy(n, p):
  flags = np.random.default_rng(n).random(n) < p
  kept = subset.KeptSet.from_flags(flags)
  ids = np.flatnonzero(flags)
  assert kept.kept == len(ids) and kept.n == n
  np.testing.assert_array_equal(kept.contains(np.arange(n)), flags)
  np.testing.assert_array_equal(kept.rank(np.arange(n)), np.cumsum(flags) - flags)
  np.testing.assert_array_equal(kept.rank_at([0, n]), [0, len(ids)])
  if len(ids):
    np.testing.assert_array_equal(kept.select(np.arange(len(ids))), ids)
    with pytest.raises(IndexError):
      kept.select([len(ids)])
  np.testing.assert_array_equal(kept.flags(min(5, n), n), flags[min(5, n):])
  writer = subset.BitWriter()
  for a in range(0, n, 1234):   # appended shard by shard, at byte-unaligned borders
    writer.add(flags[a:a + 1234])
  np.testing.assert_array_equal(writer.finish(), subset.pack(flags))


def test_a_damaged_bit_file_is_refused():
  bits = subset.pack(np.ones(10, bool))
  bits[3] = 1   # a pair beyond the dataset's 10 marked kept
  with pytest.raises(errors.DataError, match="beyond its dataset's 10"):
    subset.KeptSet(bits, 10)


def _score_dir(out, sizes_per_dataset, rng, ties=False, nan_every=13):
  """Score files written as an audit would, for datasets of the given shard sizes; returns the scores by id."""
  identities, scores = [], []
  for d, sizes in enumerate(sizes_per_dataset):
    n = sum(sizes)
    identities.append(dict(root=f"/data/d{d}", name=f"d{d}", shards=[f"{s:05d}.tar" for s in range(len(sizes))],
                           counts=list(sizes), sizes=[1000 + s for s in range(len(sizes))], num_examples=n))
    values = rng.normal(size=n).astype(np.float32)
    if ties:
      values = np.round(values, 1)   # many equal scores: ties broken by the lower id
    values[::nan_every] = np.nan     # bad records
    scores.append(values)
  offsets = np.concatenate([[0], np.cumsum([i["num_examples"] for i in identities])])[:-1]
  manifest = score_files.make_manifest(identities, offsets, dict(kind="similarity", init="test"))
  fileio.write_text(fileio.join(score_files.scores_dir(out), "manifest.json"), json.dumps(manifest))
  for d, ident in enumerate(identities):
    first = 0
    for s, n in enumerate(ident["counts"]):
      v = scores[d][first:first + n]
      ids = offsets[d] + first + np.arange(n)
      score_files.write_shard(score_files.shard_file(out, d, ident["shards"][s]), dict(
          id=ids, key=[f"k{i}" for i in ids], score=v, bad=["bad" if np.isnan(x) else "" for x in v],
          offset=np.full(n, -1), length=np.full(n, -1), clean=np.full(n, -1)), {})
      first += n
  return manifest, scores


def _expected_top(values, fraction):
  valid = np.flatnonzero(~np.isnan(values))
  k = int(round(fraction * len(valid)))
  order = valid[np.lexsort((valid, -values[valid]))]   # highest score first, then the lower id
  flags = np.zeros(len(values), bool)
  flags[order[:k]] = True
  return flags


@pytest.mark.parametrize("ties", [False, True])
def test_the_kept_fraction_is_exactly_the_top_scores_with_ties_broken_by_id(tmp_path, ties):
  out = str(tmp_path / "audit")
  _, scores = _score_dir(out, [[300, 411, 97], [250, 250]], np.random.default_rng(1), ties=ties)
  every = np.concatenate(scores)
  for keep in (0.7, 0.25, 1.0):
    bits, decided = subset.choose(out, keep=keep)
    flags = np.concatenate([subset.KeptSet(b, len(s)).flags(0, len(s)) for b, s in zip(bits, scores)])
    np.testing.assert_array_equal(flags, _expected_top(every, keep))
    assert decided["kept"] == [int(f.sum()) for f in np.split(flags, [len(scores[0])])]
    assert not flags[np.isnan(every)].any()
  # per dataset: each dataset's own top 70%
  bits, _ = subset.choose(out, keep=0.7, per_dataset=True)
  for b, s in zip(bits, scores):
    np.testing.assert_array_equal(subset.KeptSet(b, len(s)).flags(0, len(s)), _expected_top(s, 0.7))
  # a threshold
  bits, _ = subset.choose(out, min_score=0.3)
  for b, s in zip(bits, scores):
    np.testing.assert_array_equal(subset.KeptSet(b, len(s)).flags(0, len(s)), np.nan_to_num(s, nan=-9) >= 0.3)
  with pytest.raises(errors.ConfigurationError, match="one of them"):
    subset.choose(out, keep=0.5, min_score=0.1)


def test_an_unfinished_audit_cannot_be_filtered(tmp_path):
  out = str(tmp_path / "audit")
  manifest, _ = _score_dir(out, [[50, 60]], np.random.default_rng(2))
  fileio.remove(score_files.shard_file(out, 0, "00001.tar"))
  with pytest.raises(errors.DataError, match=r"1 of the shards' score files are missing .*d0/00001.tar"):
    subset.choose(out, keep=0.5)


@pytest.fixture
def small_web(tmp_path):
  root = str(tmp_path / "web")
  web_synthetic.write_img2dataset(root, 0, shard_sizes=[40, 55, 30], image_size=8, pool=4)
  return root


def test_a_filter_is_refused_on_data_it_was_not_chosen_from_and_its_kept_pairs_write_as_shards(tmp_path, small_web):
  ds = web.open_dataset(small_web)
  flags = np.random.default_rng(3).random(ds.num_examples) < 0.6
  path = str(tmp_path / "filter")
  subset.write_filter(path, [subset.dataset_identity(ds)], [subset.pack(flags)], dict(keep=0.6), dict(kind="test"))
  opened = subset.open_subset(path, [ds])
  assert opened.kept[0].kept == flags.sum() and "60%" in opened.describe()
  with pytest.raises(errors.ConfigurationError, match="written for 1 datasets"):
    subset.open_subset(path, [ds, ds])
  # the same data as new img2dataset shards holding the kept pairs only
  out_root = str(tmp_path / "kept")
  assert subset.write_shards(path, out_root) == flags.sum()
  kept_ds = web.open_dataset(out_root)
  assert kept_ds.num_examples == flags.sum()
  new = [x for s in range(len(kept_ds.shards)) for x in kept_ds.iter_shard(s)]
  old = [x for s in range(len(ds.shards)) for x in ds.iter_shard(s)]
  assert [(x.key, x.caption, x.image) for x in new] == [(x.key, x.caption, x.image) for x, f in zip(old, flags) if f]
  # a shard rewritten with another size: the filter belongs to other data
  shard = ds.shards[1]
  fileio.write_bytes(shard, fileio.read_bytes(shard) + b"\0" * 1024)
  with pytest.raises(errors.DataError, match="shard 00001.tar of .* has \\d+ bytes, the filter's data had"):
    subset.open_subset(path, [web.open_dataset(small_web)])


def test_a_filter_is_refused_after_a_same_size_rewrite_and_a_rebuild(tmp_path, small_web):
  # the error of a changed shard asks for a rebuild; after it, the same count of other pairs under the same ids must
  # not pass for the data the filter was chosen from (before 2026-11-26 names, counts and sizes let it through)
  web_index.build_index(small_web, workers=1)
  ds = web.open_dataset(small_web)
  flags = np.arange(ds.num_examples) % 2 == 0
  path = str(tmp_path / "filter")
  subset.write_filter(path, [subset.dataset_identity(ds)], [subset.pack(flags)], dict(keep=0.5), dict(kind="test"))
  shard = ds.shards[2]
  data = fileio.read_bytes(shard)
  os.remove(shard)
  fileio.write_bytes(shard, data)                                   # the same bytes, written anew
  web_index.build_index(small_web, workers=1)
  with pytest.raises(errors.DataError, match=r"shard 00002.tar of .* was rewritten since it was scored"):
    subset.open_subset(path, [web.open_dataset(small_web)])
