import numpy as np
import pytest

from ncjax.data.embedded import digits
from ncjax.data.noise import load_noise_file, make_noisy_index
from ncjax.tokenizers import WordTokenizer, tokenizer_from_json


def test_digits_scans_are_scikit_learns_read_without_importing_it():
  """digits reads the CSV scikit-learn bundles itself (importing scikit-learn costs every command ~2.5 s): the
  same 1,797 scans and labels as `sklearn.datasets.load_digits`."""
  from sklearn.datasets import load_digits
  digits._raw.cache_clear()
  images, labels = digits._raw()
  reference = load_digits()
  np.testing.assert_array_equal(images, reference.images.astype(np.float32) / 16.0)
  np.testing.assert_array_equal(labels, reference.target)
  assert images.dtype == np.float32 and labels.dtype == np.int64 and images.shape == (1797, 8, 8)


def test_digits_split_is_fixed_stratified_and_complete():
  train, test = digits.split_indices()
  assert len(train) + len(test) == 1797 and len(np.intersect1d(train, test)) == 0
  again = digits.split_indices()
  np.testing.assert_array_equal(train, again[0])
  tr = digits.load("train")
  te = digits.load("test")
  assert tr.images.shape == (len(train), 16, 16, 3) and tr.num_captions == len(train)
  assert te.num_captions == 2 * te.num_images  # two captions per test image
  assert set(np.bincount(te.image_labels)) <= {35, 36, 37}
  np.testing.assert_array_equal(tr.image_ids, train)
  assert tr.images.min() >= -1.0 - 1e-6 and tr.images.max() <= 1.0 + 1e-6


def test_digits_captions_name_the_class_and_describe_the_scan():
  tr = digits.load("train")
  for cap, img in zip(tr.captions[:50], tr.caption_to_image[:50]):
    label = tr.image_labels[img]
    assert digits.CLASS_NAMES[label] in cap or f" {label} " in cap
    assert any(w in cap for w in ("faint", "medium", "heavy", "leaning", "upright", "narrow", "wide"))
  assert len(set(tr.captions)) > 200  # varied, not one caption per class


def test_ncr_caption_noise_exact_fraction_consistency_and_npy_round_trip(tmp_path):
  c2i = np.repeat(np.arange(1000), 5)
  noisy = make_noisy_index(c2i, 0.4, seed=7)
  # Exactly floor(0.4 * N) captions were shuffled; a few got their own image back (no derangement).
  changed = noisy.caption_to_image != c2i
  assert changed.sum() <= 2000 and changed.sum() > 1900
  np.testing.assert_array_equal(noisy.clean, ~changed)
  # The shuffled image indices are a permutation of the selected ones: image multiset preserved.
  np.testing.assert_array_equal(np.sort(noisy.caption_to_image), np.sort(c2i))
  again = make_noisy_index(c2i, 0.4, seed=7)
  assert again.sha256 == noisy.sha256
  assert make_noisy_index(c2i, 0.4, seed=8).sha256 != noisy.sha256
  path = tmp_path / "noise.npy"
  noisy.save(str(path))
  loaded = load_noise_file(str(path), c2i)
  assert np.load(path).dtype == np.int64 and loaded.sha256 == noisy.sha256
  np.testing.assert_array_equal(loaded.clean, noisy.clean)
  der = make_noisy_index(c2i, 0.4, seed=7, derangement=True)
  assert (der.caption_to_image != c2i).sum() == 2000


def test_image_level_noise_moves_all_captions_of_an_image_together():
  c2i = np.repeat(np.arange(100), 5)
  noisy = make_noisy_index(c2i, 0.5, seed=0, level="image")
  per_image = noisy.caption_to_image.reshape(100, 5)
  assert (per_image == per_image[:, :1]).all()


def test_noise_file_of_wrong_length_is_a_clear_error(tmp_path):
  path = tmp_path / "bad.npy"
  np.save(path, np.arange(10, dtype=np.int64))
  with pytest.raises(ValueError, match="per-caption index of shape"):
    load_noise_file(str(path), np.arange(20))


def test_word_tokenizer_round_trip_and_truncation():
  tok = WordTokenizer.build(["a heavy handwritten three.", "the digit seven"], context_length=6)
  ids = tok.encode(["a heavy handwritten three, upright and new"])
  assert ids.shape == (1, 6) and ids[0, 0] == tok.sot_id and ids[0, -1] == tok.eot_id
  assert tok.decode(tok.encode(["the digit seven"])[0]) == "the digit seven"
  assert tok.encode(["unseen word"])[0, 1] == tok.unk_id
  again = tokenizer_from_json(tok.to_json())
  np.testing.assert_array_equal(again.encode(["a heavy three"]), tok.encode(["a heavy three"]))


def test_per_device_in_batch_resampling_stays_within_each_device_batch(devices):
  import jax
  import jax.numpy as jnp
  import ml_collections
  from ncjax.data.noise import InBatchResample
  from ncjax.sharding import make_mesh
  mesh = make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1)), devices)
  tokens = jnp.arange(64)[:, None] * jnp.ones((1, 4), jnp.int32)   # row i holds i
  with jax.set_mesh(mesh):
    out = jax.jit(lambda b, s: InBatchResample(0.25, 0, per_device=True)(b, s))(dict(tokens=tokens), 3)
  new, clean = np.asarray(out["tokens"][:, 0]), np.asarray(out["clean"])
  block = np.arange(64) // 8
  assert (block[new] == block).all()                 # every replacement text comes from the same device's part
  assert (~clean).reshape(8, 8).sum(1).tolist() == [2] * 8
  assert (new[clean] == np.arange(64)[clean]).all() and (new[~clean] != np.arange(64)[~clean]).all()
