"""Evaluation images decoded in parallel (`input.eval_workers`): the same arrays as the serial loop, and CSV pair
tables read as they are (`table:PATH`)."""

import os

import numpy as np
import pytest
from PIL import Image

from ncjax.data import preprocess
from ncjax.data.tables import classification
from ncjax.data.tables import readers
from ncjax.data.tables import sources


def _folder(root, n=24, size=(40, 30)):
  rng = np.random.default_rng(0)
  for k in range(n):
    d = os.path.join(root, "val", f"class_{k % 3}")
    os.makedirs(d, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), np.uint8)).save(os.path.join(d, f"{k:03d}.jpg"))
  return classification.load_image_folder(str(root), "val")


def _serial_reference(split, size):
  """The loop evaluation ran before eval_workers: decode to an array, then the evaluation transform."""
  return np.stack([preprocess.eval_transform(readers.decode_image(split.images.raw(i)), size, "openai", "shortest")
                   for i in range(len(split.images))])


def test_thread_workers_give_the_serial_arrays(tmp_path):
  split = _folder(tmp_path)
  reference = _serial_reference(split, 16)
  for workers in (0, 1, 3):
    view = sources.TransformedImages(split.images, 16, "openai", workers=workers, decode="thread")
    np.testing.assert_array_equal(view[:], reference)
    np.testing.assert_array_equal(view[np.asarray([5, 2, 2, 23])], reference[[5, 2, 2, 23]])
    np.testing.assert_array_equal(view[7], reference[7])
    view.close()
  assert sources.resolve_workers(-1) == sources.usable_cores() >= 1
  with pytest.raises(ValueError, match="unknown decode mode"):
    sources.TransformedImages(split.images, 16, "openai", decode="fibers")


@pytest.mark.slow   # spawns two interpreters
def test_process_workers_give_the_serial_arrays(tmp_path):
  split = _folder(tmp_path, n=10)
  view = sources.TransformedImages(split.images, 16, "openai", workers=2, decode="process")
  np.testing.assert_array_equal(view[np.arange(10)], _serial_reference(split, 16))
  view.close()


def test_pair_table_groups_captions_by_image_and_reads_labels(tmp_path):
  img = np.zeros((8, 8, 3), np.uint8)
  for name in ("a.png", "b.png"):
    Image.fromarray(img).save(tmp_path / name)
  (tmp_path / "pairs.tsv").write_text("filepath\ttitle\tlabel\na.png\ta cat\tcat\nb.png\ta dog\tdog\n"
                                      "a.png\tanother cat\tcat\n")
  split = classification.load_pair_table(str(tmp_path / "pairs.tsv"), "test")
  assert split.captions == ["a cat", "a dog", "another cat"]
  assert split.caption_to_image.tolist() == [0, 1, 0] and split.num_images == 2
  assert split.class_names == ("cat", "dog") and split.image_labels.tolist() == [0, 1]
  (tmp_path / "test.csv").write_text("image,caption\na.png,one\nmissing.png,two\n")
  with pytest.raises(readers.DataFormatError, match="1 image files do not exist"):
    classification.load_pair_table(str(tmp_path), "test")
  (tmp_path / "test.csv").write_text("img,words\na.png,one\n")
  with pytest.raises(readers.DataFormatError, match="expected an image column"):
    classification.load_pair_table(str(tmp_path), "test")
