"""The torch side of the accelerator check, in a process without JAX: open_clip's ViT-B-16 train step (section b)
and the public NCU loop restated in PyTorch (section c), on the same card as ncjax's numbers.

Section b trains open_clip the way its own training script does on one GPU: AMP autocast to bfloat16 with float32
weights, PyTorch's scaled-dot-product attention (open_clip's blocks call `nn.MultiheadAttention` without attention
weights, which dispatches to SDPA), AdamW and open_clip's `ClipLoss`, eager and under `torch.compile`. The
optimiser settings and the gradient clipping (norm 1.0) are ncjax's CLIP config's, so both sides do the same work
per step. Random initialisation and random inputs: nothing is downloaded.
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

SOT, EOT = 49406, 49407   # CLIP's BPE start and end tokens (open_clip pools the text at the largest id, EOT)


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
               text_cfg=dict(context_length=16, vocab_size=cfg["text_cfg"]["vocab_size"], width=64, heads=2,
                             layers=1))
  return open_clip, open_clip.CLIP(**cfg), cfg


def _inputs(batch: int, cfg: dict, device, seed: int = 0):
  """Random pixels and caption-like token rows: SOT, 3-20 word ids, EOT, padding zeros."""
  import torch
  gen = np.random.default_rng(seed)
  size = cfg["vision_cfg"]["image_size"]
  context = cfg["text_cfg"]["context_length"]
  images = torch.as_tensor(gen.standard_normal((batch, 3, size, size), dtype=np.float32), device=device)
  tokens = np.zeros((batch, context), np.int64)
  lengths = gen.integers(3, min(20, context - 2) + 1, size=batch)
  for row, n in enumerate(lengths):
    tokens[row, 0] = SOT
    tokens[row, 1:n + 1] = gen.integers(1, SOT, size=n)
    tokens[row, n + 1] = EOT
  return images, torch.as_tensor(tokens, device=device)


def openclip_section(rec: record.Recorder, batches, smoke: bool) -> None:
  missing = torch_missing()
  if missing:
    rec.row("b", "open_clip ViT-B-16 train step", status=missing)
    return
  import torch
  device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  open_clip, model, cfg = _open_clip_model(smoke)
  model = model.to(device).train()
  loss_fn = open_clip.ClipLoss()
  opt = torch.optim.AdamW(model.parameters(), **ADAMW)
  name = "micro open_clip" if smoke else "open_clip ViT-B-16"
  version = getattr(open_clip, "__version__", "?")
  rec.write(dict(kind="machine", torch=torch.__version__, open_clip=version, torch_device=str(device),
                 torch_card=torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"))

  def forward_loss(images, tokens):
    with torch.autocast(device.type, dtype=torch.bfloat16):
      image_features, text_features, scale = model(images, tokens)
      return loss_fn(image_features, text_features, scale)

  # torch.compile's Inductor takes minutes on this CPU; the smoke run compiles with the 'eager' backend, which still
  # traces the step through TorchDynamo (what breaks first when open_clip or torch change).
  backend = "eager" if smoke else "inductor"
  kinds = [("eager", forward_loss, "openclip_eager"),
           (f"torch.compile ({backend})", None, "openclip_compile")]
  steps, rounds, warmup = (2, 2, 1) if smoke else (5, 3, 3)
  # Eager at every batch first: torch.compile's minutes are the first thing the time budget drops.
  for kind, fn, estimate in kinds:
    for batch in batches:
      config = f"{name}, torch {torch.__version__}, bf16 autocast, SDPA, batch {batch}/GPU, {kind}"
      if not rec.fits(estimate):
        rec.row("b", config, status=record.NOT_RUN_TIME, batch=batch, mode=kind)
        continue
      images, tokens = _inputs(batch, cfg, device)
      if kind != "eager":   # compiled for this batch's shapes
        torch._dynamo.reset()
        fn = torch.compile(forward_loss, backend=backend, dynamic=False)

      def step(fn=fn, images=images, tokens=tokens):
        opt.zero_grad(set_to_none=True)
        loss = fn(images, tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        opt.step()
        return loss

      try:
        if device.type == "cuda":
          torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        step()                       # the first call compiles under torch.compile
        _sync(device)
        first_s = time.perf_counter() - start
        seconds = _median_step_seconds(step, device, warmup=warmup, steps=steps, rounds=rounds)
        loss = float(step().item())
      except Exception as e:   # one configuration failing (out of memory, a compiler error) leaves the others
        rec.row("b", config, status=_failure(e), batch=batch, mode=kind)
        continue
      finally:
        del images, tokens
        if device.type == "cuda":
          torch.cuda.empty_cache()
      peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
      note = f"step {seconds * 1e3:.1f} ms" + (f", first call {first_s:.0f} s" if kind != "eager" else "")
      if peak:
        note += f", peak {peak / 2**30:.1f} GiB"
      rec.row("b", config, batch / seconds, "pairs/s", note=note, batch=batch, mode=kind, step_s=seconds,
              first_call_s=first_s, peak_bytes=peak, loss=loss, finite=math.isfinite(loss))


def _failure(e: Exception) -> str:
  text = str(e).strip().splitlines()
  return f"failed: {type(e).__name__}: {text[0][:200] if text else ''}"


# --- section c: the public NCU loop ------------------------------------------------------------------------------

def ncu_section(rec: record.Recorder, sizes, check_n: int) -> None:
  missing = torch_missing()
  if missing:
    rec.row("c", "public NCU loop (PyTorch restatement)", status=missing)
    return
  import torch
  from benchmarks.accelerator import ncu_public
  torch.backends.cuda.matmul.allow_tf32 = False   # float32 products, as the public code and the value check want
  check = ncu_public.crosscheck(record.CROSSCHECK, record.crosscheck_inputs())
  wrong = ([f"loss terms off by {check['max_abs_diff']:.2e}"] if check["max_abs_diff"] >= 1e-5 else []) + \
      ([f"forget set {check['forget']}"] if not check["same_forget"] else []) + \
      ([f"iterations {check['iterations']}"] if not check["same_iterations"] else [])
  rec.row("c", "public loop restated in PyTorch vs methods.md §1.7 (N = 8, float64)", check["max_abs_diff"],
          "max |diff|", status="failed: " + ", ".join(wrong) if wrong else "ok",
          note=f"forget {check['forget']}, iterations {check['iterations']} (notes: {record.CROSSCHECK['forget']}, "
               f"{record.CROSSCHECK['iterations']})", **{"check": "crosscheck", **check})
  device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  largest = max(sizes)
  for n in sizes:
    config = f"public NCU loop (PyTorch {torch.__version__}), loss + gradient, N = {n}, D = {record.NCU_DIM}"
    if not rec.fits("ncu_torch", (n / largest) ** 2 * 3):
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
      seconds = _median_step_seconds(loss_and_grad, device, warmup=1, steps=1, rounds=3 if n <= 8192 else 2)
    except Exception as e:
      rec.row("c", config, status=_failure(e), n=n, side="torch")
      continue
    rec.row("c", config, seconds, "s", note=f"Sinkhorn iterations {out['iterations']}", n=n, side="torch",
            loss=out["loss"], iterations=out["iterations"], value_check=n == check_n)
    del leaves
    if device.type == "cuda":
      torch.cuda.empty_cache()
