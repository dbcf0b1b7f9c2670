"""The torch side of the accelerator check, in a process without JAX: open_clip's ViT-B-16 train step (section b)
and the public NCU loop restated in PyTorch (section c), on the same card as ncjax's numbers.

Section b trains open_clip the way its own training script does on one GPU: AMP autocast to bfloat16 with float32
weights, TF32 float32 matmuls and autotuned cuDNN kernels (`open_clip_train/main.py`'s settings), PyTorch's
scaled-dot-product attention (open_clip's blocks call `nn.MultiheadAttention` without attention weights, which
dispatches to SDPA), AdamW and open_clip's `ClipLoss`, eager and under `torch.compile`, and with PyTorch's fused
AdamW. The optimiser settings and the gradient clipping (norm 1.0) are ncjax's CLIP config's, so both sides do the
same work per step. Random initialisation and random inputs: nothing is downloaded.
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

from benchmarks.accelerator import record

# ncjax's CLIP config (configs/clip.py with config_lib.apply_common): AdamW, lr 1e-3, weight decay 0.1,
# betas (0.9, 0.98), eps 1e-6, gradient clipping at global norm 1.0.
ADAMW = dict(lr=1e-3, weight_decay=0.1, betas=(0.9, 0.98), eps=1e-6)
CLIP_NORM = 1.0

# The smoke run's vocabulary: the micro size's (ncjax's micro towers embed a few dozen tokens). CLIP's 49,408 made
# each CPU step update a 3.2M-parameter embedding: a third of the smoke run's torch steps' time.
SMOKE_VOCAB = 64


def torch_missing() -> str | None:
  try:
    import torch  # noqa: F401
  except ImportError:
    return "skipped: torch not installed"
  return None


def _sync(device):
  import torch
  if device.type == "cuda":
    torch.cuda.synchronize()


def _median_step_seconds(step, device, *, warmup: int, steps: int, rounds: int) -> float:
  for _ in range(warmup):
    step()
  _sync(device)
  per_round = []
  for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(steps):
      step()
    _sync(device)
    per_round.append((time.perf_counter() - start) / steps)
  return statistics.median(per_round)


# --- section b: open_clip ----------------------------------------------------------------------------------------

def _open_clip_model(smoke: bool):
  from ncjax.testing import import_open_clip
  open_clip = import_open_clip()
  cfg = open_clip.get_model_config("ViT-B-16")
  if smoke:   # the same architecture family at the micro size of the ncjax side
    cfg = dict(embed_dim=64, vision_cfg=dict(image_size=16, layers=1, width=64, patch_size=4, head_width=32),
               text_cfg=dict(context_length=16, vocab_size=SMOKE_VOCAB, width=64, heads=2, layers=1))
  return open_clip, open_clip.CLIP(**cfg), cfg


def _inputs(batch: int, cfg: dict, device, seed: int = 0):
  """Random pixels and caption-like token rows: SOT, 3-20 word ids, EOT, padding zeros. SOT and EOT are the
  vocabulary's last two ids, as CLIP's BPE has them (open_clip pools the text at the largest id, EOT)."""
  import torch
  gen = np.random.default_rng(seed)
  sot, eot = cfg["text_cfg"]["vocab_size"] - 2, cfg["text_cfg"]["vocab_size"] - 1
  size = cfg["vision_cfg"]["image_size"]
  context = cfg["text_cfg"]["context_length"]
  images = torch.as_tensor(gen.standard_normal((batch, 3, size, size), dtype=np.float32), device=device)
  tokens = np.zeros((batch, context), np.int64)
  lengths = gen.integers(3, min(20, context - 2) + 1, size=batch)
  for row, n in enumerate(lengths):
    tokens[row, 0] = sot
    tokens[row, 1:n + 1] = gen.integers(1, sot, size=n)
    tokens[row, n + 1] = eot
  return images, torch.as_tensor(tokens, device=device)


class OpenClipWorker:
  """Section b. Prepared: open_clip's model and optimiser on the card, and its step under torch.compile at the
  largest batch (its first call, which compiles, timed and reported). Turn: eager at every batch, eager with fused
  AdamW at the largest, the compiled step at the largest; then section c's public loop.

  The settings are open_clip's trainer's (`open_clip_train/main.py` sets `torch.backends.cuda.matmul.allow_tf32`
  and `torch.backends.cudnn.benchmark`): float32 matmuls outside autocast in TF32, cuDNN's kernels autotuned."""

  def __init__(self, rec: record.Recorder, batches, smoke: bool):
    self.rec, self.batches, self.smoke = rec, sorted(batches), smoke
    self.missing = torch_missing()
    if self.missing:
      return
    import torch
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    open_clip, model, self.cfg = _open_clip_model(smoke)
    self.model = model.to(self.device).train()
    self.loss_fn = open_clip.ClipLoss()
    self.name = "micro open_clip" if smoke else "open_clip ViT-B-16"
    rec.write(dict(kind="machine", torch=torch.__version__, open_clip=getattr(open_clip, "__version__", "?"),
                   torch_device=str(self.device),
                   torch_card=torch.cuda.get_device_name(0) if self.device.type == "cuda" else "cpu"))
    self.optimizers = {"AdamW": torch.optim.AdamW(self.model.parameters(), **ADAMW)}
    # torch.compile's Inductor takes minutes on this CPU; the smoke run compiles with the 'eager' backend, which
    # still traces the step through TorchDynamo (what breaks first when open_clip or torch change).
    self.backend = "eager" if smoke else "inductor"
    torch._dynamo.reset()
    self.compiled = torch.compile(self._forward_loss, backend=self.backend, dynamic=False)
    self.first_call_s = self.compile_error = None
    batch = self.batches[-1]
    images, tokens = _inputs(batch, self.cfg, self.device)
    try:
      start = time.perf_counter()
      self._step(self.compiled, self.optimizers["AdamW"], images, tokens)   # compiles for this batch's shapes
      _sync(self.device)
      self.first_call_s = time.perf_counter() - start
    except Exception as e:
      self.compile_error = _failure(e)
    finally:
      images = tokens = None
      if self.device.type == "cuda":
        torch.cuda.empty_cache()   # give back what the compile's first step took while other workers prepare

  def _forward_loss(self, images, tokens):
    import torch
    with torch.autocast(self.device.type, dtype=torch.bfloat16):
      image_features, text_features, scale = self.model(images, tokens)
      return self.loss_fn(image_features, text_features, scale)

  def _step(self, fn, opt, images, tokens):
    import torch
    opt.zero_grad(set_to_none=True)
    loss = fn(images, tokens)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP_NORM)
    opt.step()
    return loss

  def turn(self) -> None:
    rec = self.rec
    if self.missing:
      rec.row("b", "open_clip ViT-B-16 train step", status=self.missing)
      return
    import torch
    largest = self.batches[-1]
    runs = [(b, "eager", "AdamW") for b in self.batches] + [(largest, "eager, fused AdamW", "AdamW (fused)")]
    runs.append((largest, f"torch.compile ({self.backend})", "AdamW"))
    for batch, mode, opt_name in runs:
      config = f"{self.name}, torch {torch.__version__}, bf16 autocast, SDPA, TF32, batch {batch}/GPU, {mode}"
      if mode.startswith("torch.compile") and self.compile_error:
        rec.row("b", config, status=self.compile_error, batch=batch, mode=mode)
        continue
      if not rec.fits("eager"):
        rec.row("b", config, status=record.NOT_RUN_TIME, batch=batch, mode=mode)
        continue
      if opt_name not in self.optimizers:   # the fused kernel: CUDA only (the smoke run's CPU has it in torch >= 2.4)
        self.optimizers[opt_name] = torch.optim.AdamW(self.model.parameters(), **ADAMW, fused=True)
      fn = self.compiled if mode.startswith("torch.compile") else self._forward_loss
      opt = self.optimizers[opt_name]
      images, tokens = _inputs(batch, self.cfg, self.device)
      steps, rounds, warmup = (1, 1, 1) if self.smoke else (5, 3, 3)
      try:
        if self.device.type == "cuda":
          torch.cuda.reset_peak_memory_stats()
        seconds = _median_step_seconds(lambda: self._step(fn, opt, images, tokens), self.device, warmup=warmup,
                                       steps=steps, rounds=rounds)
        loss = float(self._step(fn, opt, images, tokens).item())
      except Exception as e:   # one configuration failing (out of memory, a compiler error) leaves the others
        rec.row("b", config, status=_failure(e), batch=batch, mode=mode)
        continue
      finally:
        images = tokens = None
        if self.device.type == "cuda":
          torch.cuda.empty_cache()
      peak = torch.cuda.max_memory_allocated() if self.device.type == "cuda" else None
      note = f"step {seconds * 1e3:.1f} ms"
      if mode.startswith("torch.compile"):
        note += f", first call (the compile) {self.first_call_s:.0f} s"
      if peak:
        note += f", peak {peak / 2**30:.1f} GiB"
      rec.row("b", config, batch / seconds, "pairs/s", note=note, batch=batch, mode=mode, step_s=seconds,
              first_call_s=self.first_call_s if mode.startswith("torch.compile") else None, peak_bytes=peak,
              loss=loss, finite=math.isfinite(loss))


def _failure(e: Exception) -> str:
  text = str(e).strip().splitlines()
  return f"failed: {type(e).__name__}: {text[0][:200] if text else ''}"


# --- section c: the public NCU loop ------------------------------------------------------------------------------

def ncu_section(rec: record.Recorder, sizes, check_n: int, *, smoke: bool = False) -> None:
  missing = torch_missing()
  if missing:
    rec.row("c", "public NCU loop (PyTorch restatement)", status=missing)
    return
  import torch
  from benchmarks.accelerator import ncu_public
  torch.backends.cuda.matmul.allow_tf32 = False   # float32 products, as the public code and the value check want
  expected = record.crosscheck_values()
  check = ncu_public.crosscheck(expected, record.crosscheck_inputs())
  wrong = ([f"loss terms off by {check['max_abs_diff']:.2e}"] if check["max_abs_diff"] >= 1e-5 else []) + \
      ([f"forget set {check['forget']}"] if not check["same_forget"] else []) + \
      ([f"iterations {check['iterations']}"] if not check["same_iterations"] else [])
  rec.row("c", "public loop restated in PyTorch vs methods.md §1.7 (N = 8, float64)", check["max_abs_diff"],
          "max |diff|", status="failed: " + ", ".join(wrong) if wrong else "ok",
          note=f"forget {check['forget']}, iterations {check['iterations']} (notes: {expected['forget']}, "
               f"{expected['iterations']})", **{"check": "crosscheck", **check})
  device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  largest = max(sizes)
  for n in sizes:
    config = f"public NCU loop (PyTorch {torch.__version__}), loss + gradient, N = {n}, D = {record.NCU_DIM}"
    if not rec.fits("ncu_torch", (n / largest) ** 2):
      rec.row("c", config, status=record.NOT_RUN_TIME, n=n, side="torch")
      continue
    leaves = [torch.tensor(x, device=device, requires_grad=True) for x in record.ncu_inputs(n)]
    out = {}

    def loss_and_grad():
      for x in leaves:
        x.grad = None
      forget = ncu_public.select_forget(leaves[0], leaves[1], record.NCU_LOGIT_SCALE, record.NCU_FORGET_RATIO)
      loss, terms = ncu_public.stage2_loss(*leaves, record.NCU_LOGIT_SCALE, forget)
      loss.backward()
      out.update(terms, loss=loss.item())

    try:
      rounds = 1 if smoke else 3 if n <= 8192 else 2
      seconds = _median_step_seconds(loss_and_grad, device, warmup=1, steps=1, rounds=rounds)
    except Exception as e:
      rec.row("c", config, status=_failure(e), n=n, side="torch")
      continue
    rec.row("c", config, seconds, "s", note=f"Sinkhorn iterations {out['iterations']}", n=n, side="torch",
            loss=out["loss"], iterations=out["iterations"], value_check=n == check_n)
    leaves = None
    if device.type == "cuda":
      torch.cuda.empty_cache()
