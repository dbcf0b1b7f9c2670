"""Zero-shot classification with prompt ensembles (CLIP / open_clip / CLIP_benchmark convention).

Per class: encode every template filled with the class name, normalise each embedding, average over templates and
renormalise. Images are scored against the class embeddings with the model's own score (cosine for CLIP; the
Lorentzian inner product for MERU). Reported: top-1, top-5 (NaN with fewer than 5 classes) and mean per-class recall.
"""

from __future__ import annotations

import functools
import json
import os

import numpy as np

from ncjax.evals import common
from ncjax.evals.base import Evaluator, register

_TEMPLATE_FILE = os.path.join(os.path.dirname(__file__), "templates", "clip.json")


@functools.lru_cache(maxsize=None)
def _builtin_templates() -> dict:
  with open(_TEMPLATE_FILE, encoding="utf-8") as f:
    return {k: tuple(v) for k, v in json.load(f).items() if not k.startswith("_")}


def _read_list_file(path: str, what: str, dataset: str = ""):
  """A .txt file (one entry per line) or a JSON file: a list, a {class name: [prompts]} dict, or a dict keyed by
  dataset (CLIP_benchmark's en_zeroshot_classification_templates.json / en_classnames.json layout), of which the
  evaluated dataset's entry is taken."""
  with open(path, encoding="utf-8") as f:
    if not path.endswith(".json"):
      return tuple(line.rstrip("\n") for line in f if line.strip())
    data = json.load(f)
  if isinstance(data, list):
    return tuple(data)
  if isinstance(data, dict):
    from ncjax.data.tables.classification import TFDS_TO_CLIP_BENCHMARK
    base = dataset.split(":", 1)[-1].split("/")[0]
    for key in (dataset, base, TFDS_TO_CLIP_BENCHMARK.get(base, "")):
      if key and key in data and isinstance(data[key], list):
        return tuple(data[key])
    if what == "templates":
      return {k: tuple(v) for k, v in data.items()}   # class-specific prompts
    raise ValueError(f"{path}: a dict of class-name lists without an entry for {dataset!r} (keys: "
                     f"{sorted(data)[:10]})")
  raise ValueError(f"{path}: expected a JSON list or dict of {what}")


def templates_for(name: str, dataset: str = ""):
  """A template set: 'imagenet80' (CLIP paper), 'imagenet7' (OpenAI's subset), 'cifar', 'single', 'digits' (the
  digits caption templates with their attributes marginalised), 'digits_plain' (four class-only prompts), 'scenes'
  (the scenes captions' wording, the class — the large object's colour — with every size word and shape), 'auto'
  (the evaluated dataset's own CLIP prompts: digits', or CLIP_benchmark's for tfds:cifar10, tfds:imagenet2012, ...;
  imagenet80 otherwise), a CLIP_benchmark dataset key ('cifar100', 'imagenet1k', 'pets', ...: its prompts), or a
  file: .txt (one template per line), JSON list, JSON {class name: [prompts]} (class-specific, CuPL-style) or JSON
  {dataset: [templates]} (CLIP_benchmark's layout). Templates hold '{}' or CLIP_benchmark's '{c}'."""
  from ncjax.data.tables.classification import zeroshot_templates
  if name == "auto":
    base = dataset.split(":", 1)[-1].split("/")[0]
    if base in ("digits", "scenes"):
      name = base
    else:
      return zeroshot_templates(base) or _builtin_templates()["imagenet80"]
  if name == "digits":
    from ncjax.data.embedded.digits import ZEROSHOT_TEMPLATES
    return ZEROSHOT_TEMPLATES
  if name == "scenes":
    from ncjax.data.embedded.scenes import ZEROSHOT_TEMPLATES
    return ZEROSHOT_TEMPLATES
  if name == "digits_plain":
    from ncjax.data.embedded.digits import PLAIN_TEMPLATES
    return PLAIN_TEMPLATES
  builtin = _builtin_templates()
  if name in builtin:
    return builtin[name]
  if os.path.isfile(name):
    found = _read_list_file(name, "templates", dataset)
    if isinstance(found, dict):
      return found
    found = tuple(t.replace("{c}", "{}") for t in found)
    if not found or not all("{}" in t for t in found):
      raise ValueError(f"{name}: every template must hold '{{}}' (or '{{c}}') where the class name goes")
    return found
  known = zeroshot_templates(name)
  if known:
    return known
  own = ["digits", "digits_plain", "scenes"]
  raise ValueError(f"unknown template set {name!r}; built in: {sorted(builtin) + own}, a "
                   f"CLIP_benchmark dataset key (cifar10, imagenet1k, ...), or a .txt / .json file path")


def class_names_for(spec: str, dataset: str, own) -> tuple[str, ...]:
  """The class names zero-shot prompts are filled with: the split's own (`spec` ''), CLIP_benchmark's curated
  names of a dataset key ('imagenet1k', 'cifar10', ...), or a file: .txt (one name per line, in label order), JSON
  list, or JSON {dataset: [names]} (CLIP_benchmark's en_classnames.json layout)."""
  if not spec:
    return tuple(own)
  if os.path.isfile(spec):
    names = _read_list_file(spec, "class names", dataset)
  else:
    from ncjax.data.tables.classification import curated_class_names
    names = curated_class_names(spec)
    if names is None:
      raise ValueError(f"classnames={spec!r} is neither a file nor a dataset with CLIP_benchmark's curated names")
  names = tuple(names)
  if own and len(names) != len(own):
    raise ValueError(f"classnames={spec!r} gives {len(names)} names for the {len(own)} classes of {dataset}")
  return names


def ensemble_sphere(template_embeddings: np.ndarray) -> np.ndarray:
  """(C, T, D) -> (C, D): normalise each template embedding, mean over templates, renormalise."""
  e = template_embeddings / np.maximum(np.linalg.norm(template_embeddings, axis=-1, keepdims=True), 1e-12)
  m = e.mean(axis=1)
  return m / np.maximum(np.linalg.norm(m, axis=-1, keepdims=True), 1e-12)


def classifier(eval_model, tokenizer, class_names, templates, mesh, batch_size: int = 512) -> np.ndarray:
  """(C, D) class embeddings: every template filled with each class name, ensembled by the model's geometry.

  `templates` may be a dict class name -> its own prompts (class-specific sets); each class is then ensembled
  over its own prompts."""
  ensemble = getattr(eval_model, "ensemble", None) or ensemble_sphere
  if isinstance(templates, dict):
    missing = [c for c in class_names if c not in templates]
    if missing:
      raise ValueError(f"class-specific templates lack classes {missing[:5]}")
    rows = []
    for c in class_names:
      emb = common.embed_texts(eval_model, tokenizer.encode(list(templates[c])), batch_size, mesh)
      rows.append(np.asarray(ensemble(emb[None]))[0])
    return np.stack(rows)
  texts = [t.format(c) for c in class_names for t in templates]
  emb = common.embed_texts(eval_model, tokenizer.encode(texts), batch_size, mesh)
  emb = emb.reshape(len(class_names), len(templates), -1)
  return np.asarray(ensemble(emb))


def accuracy(scores: np.ndarray, labels: np.ndarray, num_classes: int | None = None) -> dict:
  """top-1 / top-5 accuracy (fractions) and mean per-class recall (balanced accuracy). Ties: lower class first."""
  scores = np.asarray(scores, np.float32)
  labels = np.asarray(labels)
  n, c = scores.shape
  order = np.argsort(-scores, axis=1, kind="stable")
  pred = order[:, 0]
  top1 = pred == labels
  out = {"acc1": float(top1.mean()) if n else float("nan")}
  out["acc5"] = float((order[:, :5] == labels[:, None]).any(axis=1).mean()) if c >= 5 else float("nan")
  classes = np.unique(labels) if num_classes is None else np.arange(num_classes)
  recalls = [top1[labels == k].mean() for k in classes if np.any(labels == k)]
  out["mean_per_class_recall"] = float(np.mean(recalls)) if recalls else float("nan")
  return out


@register("zeroshot")
class ZeroShot(Evaluator):
  """Zero-shot classification of the split's labelled images with a prompt ensemble.

  Args:
    templates: a template set name (see `templates_for`; 'auto': the dataset's own prompts), a CLIP_benchmark
      dataset key, or a .txt / .json file path.
    classnames: '' (the dataset's own names), a CLIP_benchmark dataset key (its curated names), or a .txt / .json
      file (see `class_names_for`).
    dataset, split: see Evaluator.
  """
  task = "zeroshot_classification"

  def __init__(self, context, *, templates: str = "auto", classnames: str = "", dataset: str = "",
               split: str = "test", data_dir: str = ""):
    super().__init__(context, dataset=dataset, split=split, data_dir=data_dir)
    self.templates, self.classnames = templates, classnames

  def class_names(self, split) -> tuple[str, ...]:
    return class_names_for(self.classnames, self.dataset_name, split.class_names)

  def check(self):
    split = self.data()
    if split.image_labels is None:
      raise ValueError(f"{split.name} has no class labels: zero-shot classification needs them")
    templates_for(self.templates, self.dataset_name)
    self.class_names(split)

  def scores(self, eval_model):
    split = self.data()
    if split.image_labels is None:
      raise ValueError(f"{split.name} has no class labels: zero-shot classification needs them")
    ctx = self.context
    dataset = self.dataset_name
    weights = classifier(eval_model, ctx.tokenizer, self.class_names(split), templates_for(self.templates, dataset),
                         ctx.mesh, self.batch_size)
    img = common.embed_images(eval_model, self.images(split), self.batch_size, ctx.mesh)
    return common.score_matrix(eval_model, img, weights), split

  def run(self, eval_model) -> dict:
    scores, split = self.scores(eval_model)
    return accuracy(scores, split.image_labels, len(split.class_names))
