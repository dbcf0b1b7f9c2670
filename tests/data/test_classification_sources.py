"""Labelled image data from local files for zero-shot and linear probes: image folders, tables, prepared tfds."""

import socket
import sys

import numpy as np
import pytest

import data_fixtures as fx
from ncjax import data as data_lib
from ncjax.data.tables import classification
from ncjax.data.tables import readers
from ncjax.evals import zeroshot


def _load(dataset, split, data_dir=""):
  return data_lib.load_split(data_lib.InputSpec(dataset=dataset, data_dir=data_dir), split, 32)


def test_image_folder_tree_with_splits_and_readable_class_names(tmp_path):
  root = fx.write_image_folder(str(tmp_path / "imgs"))
  test = _load(f"image_folder:{root}", "test")
  assert test.class_names == ("tench", "goldfish", "great white shark")
  np.testing.assert_array_equal(test.image_labels, [0, 0, 1, 1, 2, 2])
  assert test.captions[2] == "a photo of a goldfish." and len(_load(f"image_folder:{root}", "train").captions) == 9
  images = data_lib.eval_images(test, 32, "openai")
  batch = images[0:4]
  assert batch.shape == (4, 32, 32, 3) and batch.dtype == np.float32


def test_image_folder_table_with_names_or_indices(tmp_path):
  root = tmp_path / "tab"
  fx.write_image_folder(str(root))
  (root / "classnames.txt").write_text("tench\ngoldfish\ngreat white shark\n")
  (root / "test.csv").write_text("path,label\ntest/n01440764/0.png,goldfish\ntest/n01443537/1.png,2\n")
  split = _load(f"image_folder:{root}", "test")
  np.testing.assert_array_equal(split.image_labels, [1, 2])
  (root / "test.csv").write_text("path,label\ntest/n01440764/0.png,salmon\n")
  with pytest.raises(readers.DataFormatError, match="label 'salmon' is neither an index nor a name"):
    _load(f"image_folder:{root}", "test")
  with pytest.raises(readers.DataFormatError, match="is not a directory"):
    _load(f"image_folder:{tmp_path / 'missing'}", "test")


class _NoTensorFlow:
  """A meta-path finder refusing `tensorflow` and its submodules."""

  def find_spec(self, name, path=None, target=None):
    if name == "tensorflow" or name.startswith("tensorflow."):
      raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
    return None


@pytest.mark.parametrize("tfrecord", [False, True])
def test_prepared_tfds_dataset_is_read_without_downloading_or_tensorflow(tmp_path, tfrecord, monkeypatch):
  data_dir = str(tmp_path / "tfds")
  labels = fx.write_prepared_tfds(data_dir, tfrecord=tfrecord)
  # While it reads, importing TensorFlow fails as where it is not installed (even where it is), and so does opening
  # any network connection; and TensorFlow is not imported by the read.
  assert "tensorflow" not in sys.modules
  monkeypatch.setattr(sys, "meta_path", [_NoTensorFlow()] + sys.meta_path)

  def no_network(*args, **kwargs):
    raise AssertionError(f"a network connection was attempted: {args}")

  monkeypatch.setattr(socket.socket, "connect", no_network)
  monkeypatch.setattr(socket, "create_connection", no_network)
  split = _load("tfds:cifar10", "test", data_dir)
  assert split.class_names == fx.CIFAR10_NAMES
  np.testing.assert_array_equal(split.image_labels, labels["test"])
  assert data_lib.eval_images(split, 32, "openai")[0:3].shape == (3, 32, 32, 3)
  assert "tensorflow" not in sys.modules
  with pytest.raises(readers.DataFormatError, match="no split 'validation'"):
    _load("tfds:cifar10", "validation", data_dir)


def test_curated_names_and_templates_for_known_datasets(tmp_path):
  data_dir = str(tmp_path / "tfds")
  pets = [f"breed_{i}" for i in range(37)]
  fx.write_prepared_tfds(data_dir, name="oxford_iiit_pet", names=pets, n_train=4, n_test=4)
  split = _load("tfds:oxford_iiit_pet", "test", data_dir)
  assert split.class_names[:2] == ("Abyssinian", "American Bulldog")   # CLIP_benchmark's names, not the labels
  assert len(zeroshot.templates_for("auto", "tfds:cifar10")) == 18
  assert zeroshot.templates_for("auto", "tfds:imagenet2012")[0] == "a bad photo of a {}."
  assert zeroshot.templates_for("auto", "digits") == zeroshot.templates_for("digits")
  assert len(classification.curated_class_names("imagenet2012")) == 1000
  with pytest.raises(readers.DataFormatError, match="is not prepared under .*never downloads"):
    _load("tfds:food101", "test", data_dir)
