"""`ncjax audit` of web-scale data, and `ncjax filter`: every pair of img2dataset output scored on N processes, a
subset chosen from the scores, and a report read from a bounded sample of them.

  ncjax audit --init=open_clip:PATH --dataset=web:gs://bucket/laion --output=gs://bucket/audit [--distributed]
  ncjax audit --checkpoint=RUN [--score=method]  --output=DIR        (a run on web data: its own pairs)
  ncjax filter --scores=DIR --keep=0.7 [--per_dataset] --output=FILTER_DIR [--write_keys] [--write_shards=ROOT]
  ncjax train --config=...:data=web:gs://bucket/laion --config.input.web.filter=FILTER_DIR ...

Scoring (`score_web`). Shard g of the datasets (in id order) belongs to process g mod P. Each process scores its own
shards on its own devices only (a mesh of its local devices, the batch split over them; parameters replicated there),
so processes never wait for one another while they score and a pod scores P times as fast as one host: a shard is
streamed front to back (ncjax.data.web.dataset.iter_shard: local or gs://, the store's faults retried), decoded on
threads or worker processes with the evaluation transform (ncjax.data.web.decode, as training decodes, so the
records that training skips are the records counted bad here), embedded and scored pair by pair (the model's
`pair_score`, else its geometry's score of each row: cosine for CLIP, the Lorentzian inner product for MERU). When
every pair of a shard is scored its score file is written whole (ncjax.data.web.score_files); memory is the
decoder's batches in flight and one shard's rows. A resumed audit lists the score files once and skips finished
shards; the one a kill interrupted is scored again. Each process prints its pairs/s and ETA every
`progress_every` seconds.

The run's own per-sample state (`--score=method`: GSC's labels, Bayesian CL's weights, NCU's scores), for the pairs
the run trained on, stays split over the whole mesh as training left it: every process reads it in chunks of
`STATE_CHUNK` ids (a jitted slice replicated to every process: every process runs the same number of chunks) and
writes its own shards' files; keys come from the shards' parquet (their tar where there is none), byte ranges and
clean flags from the index where it is built. No image is read.

The report (index.html, suspects, a sample, histograms) is read from the score files by ncjax.cli.web_report.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import threading
import time

import jax
import numpy as np

from ncjax import config_lib, errors, evaluation, experiment, fileio
from ncjax import sharding as shard_lib
from ncjax.cli import web_report
from ncjax.data.web import dataset as web
from ncjax.data.web import decode as web_decode
from ncjax.data.web import pipeline as web_pipeline
from ncjax.data.web import score_files, store, subset
from ncjax.data.specs import WebSpec
from ncjax.evals import common

log = logging.getLogger("ncjax")

STATE_CHUNK = 1 << 20       # ids of per-sample state read per collective step (4 MiB of float32)


@dataclasses.dataclass
class Scorer:
  """What scores the pairs: the method and its restored parameters (and per-sample state), where they came from."""
  method: object
  state: dict
  resolved: object
  tokenizer: object
  mesh: object
  info: dict
  own_dataset: str      # the web:... spec the run trained on ('' for a pretrained model)
  read_config: object = None   # whose input.web keys read the data (default: the scorer's config)


def restore(*, checkpoint: str = "", step: int | None = None, init: str = "", config=None) -> Scorer:
  """A run's checkpoint (its latest unless `step`) or a pretrained model under `config` (default: configs/clip.py)."""
  if bool(checkpoint) == bool(init):
    raise errors.ConfigurationError("audit needs --checkpoint=WORKDIR[:STEP] or --init=SPEC (one of them)")
  if checkpoint:
    if step is None:
      step = evaluation.latest_step(checkpoint)
    method, state, resolved, meta, tokenizer, mesh = evaluation.restore_for_eval(checkpoint, step)
    info = dict(checkpoint=fileio.absolute(checkpoint), step=int(step), method=method.name,
                num_examples=int(meta["num_examples"]))
    return Scorer(method, state, resolved, tokenizer, mesh, info, resolved.config.input.dataset)
  config = config if config is not None else config_lib.load_config_file("clip")
  method, state, resolved, tokenizer, mesh = evaluation.restore_pretrained(config, init)
  return Scorer(method, state, resolved, tokenizer, mesh, dict(init=init, method=method.name), "")


def _web_spec(cfg) -> WebSpec:
  """input.web of a config as the training pipeline reads it (a config without the section: the defaults)."""
  if cfg is None or cfg.get("input", None) is None:
    return WebSpec()
  return experiment.input_spec(cfg.input).web


def open_web(spec: str, cfg=None) -> list[web.WebDataset]:
  """The datasets of a 'web:ROOT[::ROOT2]' spec, read with `cfg`'s input.web keys (caption and clean keys, cache)."""
  if not web_pipeline.is_web(spec):
    raise errors.ConfigurationError(f"a web audit scores 'web:ROOT' data, got {spec!r}")
  w = _web_spec(cfg)
  policy = store.RetryPolicy(deadline_s=float(w.io_deadline_s), request_timeout_s=float(w.request_timeout_s))
  fileio.bound_requests(policy.request_timeout_s)
  return [web.open_dataset(root, caption_key=w.caption_key, clean_key=w.clean_key, cache_dir=w.cache_dir,
                           policy=policy, cache_bytes=w.cache_bytes) for root in web_pipeline.parse_roots(spec)]


def _barrier(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


# ---------------------------------------------------------------------------------------------------------------
# progress
# ---------------------------------------------------------------------------------------------------------------
class Progress:
  """Pairs scored by this process against its share, printed every `every` seconds: rate and ETA."""

  def __init__(self, total: int, shards: int, every: float, skipped_shards: int = 0):
    self.total, self.shards, self.every = int(total), int(shards), float(every)
    self.done, self.bad, self.shards_done = 0, 0, 0
    self.start = self.last = time.monotonic()
    self.first = None   # (time, pairs) after the first batch: the rate leaves out start-up and compiling
    self.skipped_shards = skipped_shards

  def rate(self) -> float:
    if self.first is None or self.done == self.first[1]:
      return self.done / max(1e-9, time.monotonic() - self.start)
    return (self.done - self.first[1]) / max(1e-9, time.monotonic() - self.first[0])

  def line(self) -> str:
    rate = self.rate()
    eta = (self.total - self.done) / rate if rate > 0 else float("nan")
    eta_text = time.strftime("%H:%M:%S", time.gmtime(eta)) if np.isfinite(eta) else "?"
    who = f"process {jax.process_index()}/{jax.process_count()}" if jax.process_count() > 1 else "scoring"
    return (f"{who}: {self.done:,} of {self.total:,} pairs ({100 * self.done / max(1, self.total):.1f}%), "
            f"shard {self.shards_done}/{self.shards}, {rate:,.0f} pairs/s, ETA {eta_text}, {self.bad:,} bad"
            + (f" ({self.skipped_shards} shards already scored)" if self.skipped_shards else ""))

  def add(self, pairs: int, bad: int = 0) -> None:
    self.done += pairs
    self.bad += bad
    now = time.monotonic()
    if self.first is None:
      self.first = (now, self.done)
    if self.every > 0 and now - self.last >= self.every:
      self.last = now
      print(self.line(), flush=True)



# ---------------------------------------------------------------------------------------------------------------
# scoring
# ---------------------------------------------------------------------------------------------------------------
def local_mesh():
  """This process's own devices as a one-axis mesh: scoring needs no other process."""
  from jax.sharding import Mesh
  return Mesh(np.asarray(jax.local_devices()), ("data",))


def pair_score_fn(method, mesh):
  """jit(params, images, tokens) -> each pair's score, the batch split over `mesh`, parameters replicated."""
  from jax.sharding import NamedSharding, PartitionSpec as P

  def fn(params, images, tokens):
    model = method.model_for_eval(params)
    zi, zt = model.encode_image(images), model.encode_text(tokens)
    if model.pair_score is not None:
      return model.pair_score(zi, zt)
    return jax.vmap(lambda a, b: model.score(a[None], b[None])[0, 0])(zi, zt)

  rows = NamedSharding(mesh, P("data"))
  return jax.jit(fn, in_shardings=(NamedSharding(mesh, P()), rows, rows), out_shardings=rows), rows


def my_shards(manifest: dict, process: int, processes: int) -> list[tuple[int, int, str, int, int]]:
  """Shard g (in id order over the datasets) belongs to process g mod P."""
  return [item for g, item in enumerate(score_files.shards_of(manifest)) if g % processes == process]


def _meta(manifest: dict, d: int, s: int) -> dict:
  ds = manifest["datasets"][d]
  return dict(dataset=d, shard=ds["shards"][s], size=ds["sizes"][s], count=ds["counts"][s], root=ds["root"],
              scorer_digest=manifest["scorer_digest"])


def _similarity(scorer: Scorer, datasets, manifest: dict, out: str, work, *, batch_size: int, threads: int,
                workers: int, prefetch: int, progress: Progress) -> None:
  """Score this process's shards `work` with the model's similarity, on this process's devices."""
  from jax.sharding import NamedSharding, PartitionSpec as P
  mesh = local_mesh()
  n_dev = mesh.devices.size
  bs = max(n_dev, batch_size // n_dev * n_dev)
  params = jax.device_put(jax.tree.map(common.host_values, scorer.state["params"]), NamedSharding(mesh, P()))
  fn, rows_sharding = pair_score_fn(scorer.method, mesh)
  cfg = scorer.resolved.config
  settings = web_decode.DecodeSettings(int(scorer.resolved.model.image_size), cfg.input.normalization, False,
                                       (1.0, 1.0), "pil", scorer.tokenizer.to_json() if workers > 0 else "")
  decoder = web_decode.make_decoder(settings, scorer.tokenizer, workers=workers, threads=threads)
  context = scorer.tokenizer.context_length
  offsets = [ds["offset"] for ds in manifest["datasets"]]
  items: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
  stop = threading.Event()

  def put(item):
    while not stop.is_set():
      try:
        items.put(item, timeout=0.5)
        return
      except queue.Full:
        continue

  def produce():
    try:
      for d, s, _, first, n in work:
        ds = datasets[d]
        batch = []
        for sample in ds.iter_shard(s):
          if stop.is_set():
            return
          gid = int(offsets[d] + sample.id)
          clean = -1 if not ds.clean_key or sample.bad else int(ds.own_clean(sample))
          span = sample.span or (-1, -1)
          batch.append((web_decode.ExampleSpec(gid, sample.caption, sample.image, (), True, sample.bad),
                        sample.key, span[0], span[1] - span[0] if span[0] >= 0 else -1, clean))
          if len(batch) == bs:
            put(("batch", d, s, batch, decoder.submit([b[0] for b in batch], context)))
            batch = []
        if batch:
          put(("batch", d, s, batch, decoder.submit([b[0] for b in batch], context)))
        put(("end", d, s, first, n))
      put(("done",))
    except BaseException as e:  # noqa: BLE001 — handed to the scoring loop, which raises it
      put(("error", e))

  reader = threading.Thread(target=produce, name="ncjax-audit-read", daemon=True)
  reader.start()
  columns = {}
  try:
    while True:
      item = items.get()
      if item[0] == "error":
        raise item[1]
      if item[0] == "done":
        break
      if item[0] == "end":
        _, d, s, first, n = item
        rows = columns.pop((d, s), None) or {k: [] for k in score_files.COLUMNS}
        if len(rows["id"]) != n or (n and (rows["id"][0] != first or rows["id"][-1] != first + n - 1)):
          raise RuntimeError(f"shard {s} of dataset {d}: {len(rows['id'])} pairs scored for {n}")
        score_files.write_shard(score_files.shard_file(out, d, manifest["datasets"][d]["shards"][s]), rows,
                                _meta(manifest, d, s))
        progress.shards_done += 1
        continue
      _, d, s, batch, pending = item
      images, tokens, errs = pending.result()
      k = len(batch)
      if k < bs:   # the shard's last batch: padded with repeats of its first row (one compiled shape)
        images = np.concatenate([images, np.repeat(images[:1], bs - k, 0)])
        tokens = np.concatenate([tokens, np.repeat(tokens[:1], bs - k, 0)])
      scores = np.asarray(fn(params, jax.device_put(images, rows_sharding), jax.device_put(tokens, rows_sharding)),
                          np.float32)[:k]
      rows = columns.setdefault((d, s), {c: [] for c in score_files.COLUMNS})
      for (spec, key, offset, length, clean), score, err in zip(batch, scores, errs):
        rows["id"].append(spec.id)
        rows["key"].append(key)
        rows["score"].append(np.float32("nan") if err is not None else score)
        rows["bad"].append(err or "")
        rows["offset"].append(offset)
        rows["length"].append(length)
        rows["clean"].append(clean)
      progress.add(k, sum(e is not None for e in errs))
  finally:
    stop.set()
    while reader.is_alive():
      try:
        items.get_nowait()
      except queue.Empty:
        reader.join(0.1)
    decoder.close()


def shard_keys(ds: web.WebDataset, s: int) -> list[str]:
  """The keys of shard s's samples in tar order: from its parquet's successful rows (no tar read), else its tar."""
  n = int(ds.counts[s])
  parquet = web._stem(ds.shards[s]) + ".parquet"   # noqa: SLF001 — the layout's sibling-file rule
  if fileio.exists(parquet):
    import pyarrow.parquet as pq
    with fileio.open_file(parquet, "rb") as f:
      pf = pq.ParquetFile(f)
      names = pf.schema_arrow.names
      if "key" in names:
        table = pf.read(columns=[c for c in ("key", "status") if c in names])
        keys = table.column("key").to_pylist()
        if "status" in names:
          keys = [k for k, st in zip(keys, table.column("status").to_pylist()) if st == "success"]
        if len(keys) >= n:
          return [str(k) for k in keys[:n]]
  keys = [x.key for x in ds.iter_shard(s)]
  return keys + [""] * (n - len(keys))


def _method_state(scorer: Scorer, datasets, manifest: dict, out: str, work, done: set, progress: Progress) -> None:
  """Write this process's shards' files from the run's per-sample clean scores (a collective over every process:
  each reads the state in the same chunks)."""
  model = scorer.method.eval_model(scorer.state["params"], scorer.state.get("method_state") or None)
  if model.clean_scores is None:
    raise errors.ConfigurationError(f"--score=method: {scorer.method.name} keeps no per-sample clean scores; use "
                                    f"--score=similarity")
  values = model.clean_scores[0]
  total = manifest["num_examples"]
  capacity = int(values.shape[0])
  if capacity < total:
    raise errors.DataError(f"the run's per-sample state holds {capacity} pairs, the data {total}: it was trained on "
                           f"other data")
  chunk = min(STATE_CHUNK, capacity)
  mesh = scorer.mesh
  take = jax.jit(lambda x, i: jax.lax.dynamic_slice_in_dim(x, i, chunk), out_shardings=shard_lib.replicated(mesh))
  pending = [w for w in work if (w[0], w[1]) not in done]
  buffers: dict = {}
  offsets = [ds["offset"] for ds in manifest["datasets"]]
  for a in range(0, total, chunk):          # the same chunks on every process
    start = min(a, capacity - chunk)
    got = np.asarray(take(values, start).addressable_data(0), np.float32)[a - start:]
    b = min(total, a + len(got))
    for d, s, name, first, n in pending:
      lo, hi = max(first, a), min(first + n, b)
      if lo >= hi:
        continue
      buffers.setdefault((d, s), np.empty(n, np.float32))[lo - first:hi - first] = got[lo - a:hi - a]
      if hi == first + n:   # the shard's last id is in: its file is complete
        ds = datasets[d]
        local = np.arange(first, first + n, dtype=np.int64) - offsets[d]
        if ds.index is not None:
          _, starts, ends = ds.index.sample_ranges(ds, local)
          lengths = np.where(starts >= 0, ends - starts, -1)
        else:
          starts = lengths = np.full(n, -1, np.int64)
        clean = ds.clean_flags(local)
        rows = dict(id=np.arange(first, first + n), key=shard_keys(ds, s), score=buffers.pop((d, s)),
                    bad=[""] * n, offset=starts, length=lengths,
                    clean=np.full(n, -1, np.int8) if clean is None else clean.astype(np.int8))
        score_files.write_shard(score_files.shard_file(out, d, name), rows, _meta(manifest, d, s))
        progress.shards_done += 1
        progress.add(n)


def score_web(out: str, scorer: Scorer, dataset: str = "", *, score: str = "auto", batch_size: int | None = None,
              threads: int = 8, workers: int = 0, prefetch: int = 4,
              progress_every: float = 30.0) -> tuple[dict, Progress]:
  """Score every pair of `dataset` (default: the run's own web data) into OUT/scores; resumes a partial OUT.
  Returns the score manifest and this process's progress (its pairs and rate)."""
  cfg = scorer.resolved.config
  spec = dataset or scorer.own_dataset
  if not spec:
    raise errors.ConfigurationError("a web audit needs --dataset=web:ROOT (or a --checkpoint of a run on web data)")
  own = bool(scorer.own_dataset) and spec == scorer.own_dataset
  datasets = open_web(spec, scorer.read_config if scorer.read_config is not None else cfg)
  sizes = [ds.num_examples for ds in datasets]
  total = int(sum(sizes))
  if own and scorer.info.get("num_examples") not in (None, total):
    raise errors.DataError(f"{spec} holds {total} pairs, the run {scorer.info['checkpoint']} trained on "
                           f"{scorer.info['num_examples']}: the data changed since")
  has_state = scorer.method.clean_scores(scorer.state["params"], scorer.state.get("method_state") or {}) \
      is not None if own and scorer.state.get("method_state") else False
  kind = score
  if score == "auto":
    kind = "method" if own and has_state else "similarity"
  if kind == "method" and not own:
    raise errors.ConfigurationError("--score=method scores the run's own training pairs only (its per-sample state "
                                    "is indexed by their ids); drop --dataset or use --score=similarity")
  if kind == "similarity" and own and cfg.noise.kind not in ("none", "in_batch_resample"):
    log.warning("the similarity of each pair as stored: the run's injected noise (noise.kind=%s) is not applied",
                cfg.noise.kind)
  scorer_info = dict(scorer.info, kind=kind if kind == "similarity" else f"method:{scorer.method.name}",
                     image_size=int(scorer.resolved.model.image_size), normalization=cfg.input.normalization)
  scorer_info.pop("num_examples", None)
  identities = [subset.dataset_identity(ds) for ds in datasets]
  manifest = score_files.make_manifest(identities, np.concatenate([[0], np.cumsum(sizes)])[:-1], scorer_info)
  if jax.process_index() == 0:
    existing = score_files.read_manifest(out)
    if existing is None:
      fileio.write_text(fileio.join(score_files.scores_dir(out), "manifest.json"), json.dumps(manifest, indent=1))
  _barrier("ncjax-web-audit-manifest")
  existing = score_files.require_manifest(out)
  differ = score_files.same_work(existing, manifest)
  if differ:
    raise errors.ConfigurationError(f"{out} holds the scores of {differ}: resume with the same model and data, or "
                                    f"write to a new --output")
  work = my_shards(manifest, jax.process_index(), jax.process_count())
  done = score_files.finished(out, manifest)
  todo = [w for w in work if (w[0], w[1]) not in done]
  progress = Progress(sum(w[4] for w in todo), len(todo), progress_every, len(work) - len(todo))
  if jax.process_index() == 0:
    print(f"scoring {total:,} pairs of {spec} ({len(score_files.shards_of(manifest))} shards, "
          f"{len(done)} already scored) on {jax.process_count()} process(es): {scorer_info['kind']}", flush=True)
  if kind == "method":
    _method_state(scorer, datasets, manifest, out, work, done, progress)
  elif todo:
    size = int(batch_size or cfg.input.eval_batch_size)
    _similarity(scorer, datasets, manifest, out, todo, batch_size=max(1, size // jax.process_count()),
                threads=threads, workers=workers, prefetch=prefetch, progress=progress)
  print(progress.line(), flush=True)
  _barrier("ncjax-web-audit-scored")
  return existing, progress


def run(output: str, *, checkpoint: str = "", step: int | None = None, init: str = "", config=None,
        dataset: str = "", score: str = "auto", top: int = 100, sample: int = 100, batch_size: int | None = None,
        threads: int = 8, workers: int = 0, progress_every: float = 30.0) -> dict:
  """`ncjax audit` of web data: restore, score every pair (every process), then the report (process 0)."""
  scorer = restore(checkpoint=checkpoint, step=step, init=init, config=config)
  if config is not None:   # --config's input settings (batch, caption and clean keys) over the run's
    scorer.read_config = config
    batch_size = batch_size or int(config.input.eval_batch_size)
  manifest, _ = score_web(output, scorer, dataset, score=score, batch_size=batch_size, threads=threads,
                       workers=workers, progress_every=progress_every)
  result = {}
  if jax.process_index() == 0:
    absent = score_files.missing(output, manifest)
    if absent:
      raise errors.DataError(f"{len(absent)} shards have no score file after scoring (e.g. {absent[0]})")
    read_config = scorer.read_config if scorer.read_config is not None else scorer.resolved.config
    result = web_report.write_report(output, None, top, sample, _web_spec(read_config))
    line = (f"audit of {result['pairs']:,} web pairs ({manifest['scorer']['kind']}, {result['bad']:,} bad): "
            f"{fileio.join(output, 'index.html')}, scores under {score_files.scores_dir(output)}")
    if result["auc"] is not None:
      line += (f"; truly noisy among the {result['top']} most suspicious: {result['top_noisy_fraction']:.1%} "
               f"(noise rate {result['noise_rate']:.1%}, AUC {result['auc']:.4f})")
    print(line, flush=True)
  return result


# ---------------------------------------------------------------------------------------------------------------
# `ncjax filter`
# ---------------------------------------------------------------------------------------------------------------
def filter_command(scores: str, output: str, *, keep: float | None = None, min_score: float | None = None,
                   per_dataset: bool = False, keys: bool = False, shards: str = "", process_index: int = 0,
                   process_count: int = 1) -> dict:
  """Write the filter directory `output` from the score files under `scores` (process 0); with `shards`, every
  process writes its share (shard g mod P) of the kept pairs as new img2dataset-layout shards under that root."""
  manifest = None
  if process_index == 0:
    t0 = time.monotonic()
    manifest = subset.write_from_scores(scores, output, keep=keep, min_score=min_score, per_dataset=per_dataset,
                                        keys=keys)
    d = manifest["decided"]
    print(f"filter {output}: kept {sum(d['kept']):,} of {sum(d['scored']):,} scored pairs "
          f"({', '.join(f'{k:,}' for k in d['kept'])} per dataset; {sum(d['bad']):,} bad records never kept"
          + (f"; score threshold {', '.join(f'{t:.6g}' for t in d['thresholds'] if t is not None)}"
             if d.get("thresholds") else "") + f") in {time.monotonic() - t0:.1f} s", flush=True)
  if shards:
    if manifest is None:   # another process: wait for process 0's filter
      deadline = time.monotonic() + 3600
      while not fileio.exists(fileio.join(output, "manifest.json")):
        if time.monotonic() > deadline:
          raise errors.DataError(f"{output}/manifest.json did not appear within an hour (process 0 writes it)")
        time.sleep(2)
    written = subset.write_shards(output, shards, process_index, process_count)
    print(f"process {process_index}: {written:,} kept pairs written as shards under {shards}", flush=True)
  return manifest or {}
