"""The embedded scenes: deterministic, in web data's regime (a caption fits only its own image), sized so NCU's
prompt and the end-of-text token fit the context, with a clean held-out split and class labels for zero-shot."""

import numpy as np

from ncjax.data.embedded import scenes


def _content(desc):
  """What a caption of the scene states: the background and each object's size, colour, shape and cell."""
  return (desc["background"],) + tuple(sorted((o["large"], o["colour"], o["shape"], o["cell"])
                                              for o in desc["objects"]))


def test_every_scene_is_a_pure_function_of_its_id_and_the_splits_are_disjoint():
  a, b = scenes.load("train", image_size=8), scenes.load("train", image_size=8)
  np.testing.assert_array_equal(a.images, b.images)
  assert a.captions == b.captions
  test = scenes.load("test", image_size=8)
  assert (a.num_images, a.num_captions) == (scenes.NUM_TRAIN, scenes.NUM_TRAIN)
  assert (test.num_images, test.num_captions) == (scenes.NUM_TEST, 2 * scenes.NUM_TEST)
  assert not set(a.image_ids.tolist()) & set(test.image_ids.tolist())
  # A scene does not depend on which other scenes were drawn: scene 17 alone equals row 17 of the split.
  np.testing.assert_allclose(scenes.render(scenes.scene(17), 8), (a.images[17] + 1) / 2, atol=1e-6)
  assert a.images.shape == (scenes.NUM_TRAIN, 8, 8, 3) and -1.0 <= a.images.min() and a.images.max() <= 1.0


def test_almost_every_caption_fits_only_its_own_image():
  """Web data's regime: a shuffled caption describes a scene no other image shows. Digits' captions, by contrast,
  are shared by every image of a class and attribute combination."""
  split = scenes.load("train", image_size=8)
  contents = [_content(scenes.scene(int(i))) for i in split.image_ids]
  counts = {}
  for c in contents:
    counts[c] = counts.get(c, 0) + 1
  unique = np.mean([counts[c] == 1 for c in contents])
  assert unique >= 0.995, unique
  assert len(set(split.captions)) == split.num_captions
  # Each caption names its own scene's background, colours and shapes.
  for k in range(50):
    desc, text = scenes.scene(int(split.image_ids[split.caption_to_image[k]])), split.captions[k]
    for o in desc["objects"]:
      assert f"{o['colour']} {o['shape']}" in text
    assert any(p in text for p in scenes._BACKGROUND_PHRASES[desc["background"]])


def test_captions_leave_room_for_ncus_prompt_and_the_end_of_text_token():
  from ncjax.models import sizes
  from ncjax.tokenizers.word import split_words
  context = sizes.SIZES["tiny_scenes"]["text"]["context_length"]
  longest = max(len(split_words(c)) for s in ("train", "test") for c in scenes.load(s, image_size=8).captions)
  n_ctx = 8   # NCU's prompt tokens
  assert 1 + n_ctx + longest + 1 <= context, (longest, context)


def test_labels_are_the_large_objects_colour_and_the_prompts_hold_no_per_image_information():
  split = scenes.load("test", image_size=8)
  for j in range(20):
    desc = scenes.scene(int(split.image_ids[j]))
    large = [o for o in desc["objects"] if o["large"]]
    assert len(large) == 1 and split.class_names[split.image_labels[j]] == large[0]["colour"]
  assert set(np.unique(split.image_labels)) == set(range(len(scenes.CLASS_NAMES)))
  for t in scenes.ZEROSHOT_TEMPLATES:
    assert t.count("{}") == 1 and not any(c in t for c in scenes.COLOUR_NAMES)
    assert not any(p in t for ps in scenes._PLACE.values() for p in ps)


def test_scenes_is_an_embedded_dataset_with_its_own_prompts_model_and_ncu_preset():
  from ncjax import config_lib, data
  from ncjax.evals.zeroshot import templates_for
  assert "scenes" in data.DATASETS and "scenes" in config_lib.EMBEDDED_DATASETS
  assert templates_for("auto", "scenes") == scenes.ZEROSHOT_TEMPLATES
  bench = config_lib.load_config_file("ncbench", "data=scenes")
  assert bench.bench.model == "tiny_scenes" and bench.bench.reference == "clip"
  ncu = config_lib.load_config_file("ncu", "data=scenes,init=/x")
  assert (ncu.method.forget_ratio, ncu.method.epochs_prompt) == (0.1, 12)
  assert ncu.model.size == config_lib.CHECKPOINT_SIZE   # the CLIP it starts from decides (tiny_scenes on scenes)
  assert config_lib.load_config_file("ncu", "data=scenes").model.size == "tiny_scenes"
  assert config_lib.load_config_file("ncu", "init=/x").method.forget_ratio == 0.4   # digits keeps its preset
  # GSC: the public code's softmax indicator (no equivalent pairs to cap it), digits keeps max_ratio
  assert config_lib.load_config_file("gsc", "data=scenes").loss.indicator == "softmax"
  assert config_lib.load_config_file("gsc", "").loss.indicator == "max_ratio"
