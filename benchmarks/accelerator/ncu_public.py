"""NCU's stage-2 loss the way its public code computes it (hhc1997/NCU, `src/ul_clip.py`), restated in PyTorch
from the description in the reference notes (methods.md §1.4 and §1.6): the baseline that section c of the
accelerator check times ncjax's `ncjax.losses.ncu.unlearning` against, on the same card.

What makes the public form slow is kept on purpose, since that is what is being compared: the log-domain Sinkhorn
rebuilds the whole N x (N+1) log-plan twice per iteration, and the stopping rule reads the change of `u` back to the
host after every iteration. What makes it numerically itself is kept too: the cost max-normalised, masked entries
set to -1e6 in log space, +1e-10 inside the log-sum-exp, two solves (the text side on the transposed cost, mask
and marginals), the text-side KL averaged over N + 1 rows (PyTorch's `batchmean` over the rows of Z^T), and the
band term over the whole batch. The N = 8 values of methods.md §1.7 check this restatement (`crosscheck`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

EPSILON = 0.03
MAX_ITERATIONS = 100
THRESHOLD = 1e-4        # stop when sum |u - u_prev| falls below it
MASKED = -1e6           # a masked entry of the log-plan
LSE_FLOOR = 1e-10       # added inside the log of the log-sum-exp
KAPPA = 0.7             # targets: kappa rownorm(plan) + (1 - kappa) identity
BAND = (-0.7, -0.2)     # <t_i, t_i^Neg> is pushed into this band


def logsumexp_rows(a: torch.Tensor) -> torch.Tensor:
  """max + log(sum exp(a - max) + 1e-10) along each row."""
  top = a.max(dim=1, keepdim=True).values
  return top.squeeze(1) + torch.log(torch.exp(a - top).sum(dim=1) + LSE_FLOOR)


def sinkhorn(cost: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor):
  """(plan, iterations) of the masked log-domain Sinkhorn with marginals `rows` and `cols`: u then v (the new u)
  per iteration, so the column marginals come out exact and the rows approximate."""
  log_rows, log_cols = torch.log(rows), torch.log(cols)
  u = torch.zeros_like(rows)
  v = torch.zeros_like(cols)

  def log_plan(u, v):
    return ((-cost + u[:, None] + v[None, :]) / EPSILON).masked_fill(~mask, MASKED)

  iterations = 0
  for _ in range(MAX_ITERATIONS):
    u_prev = u
    u = EPSILON * (log_rows - logsumexp_rows(log_plan(u, v))) + u
    v = EPSILON * (log_cols - logsumexp_rows(log_plan(u, v).T)) + v
    iterations += 1
    if (u - u_prev).abs().sum().item() < THRESHOLD:
      break
  return torch.exp(log_plan(u, v)), iterations


@torch.no_grad()
def select_forget(image: torch.Tensor, text: torch.Tensor, logit_scale: float, ratio: float) -> torch.Tensor:
  """The floor(ratio N) pairs with the smallest image->text softmax diagonal (methods.md §1.4), as a bool mask."""
  n = image.shape[0]
  confidence = torch.softmax(math.exp(logit_scale) * image @ text.T, dim=1).diagonal()
  forget = torch.zeros(n, dtype=torch.bool, device=image.device)
  forget[torch.topk(confidence, int(math.floor(ratio * n)), largest=False).indices] = True
  return forget


def stage2_loss(image, text, neg_text, logit_scale: float, forget):
  """(loss, terms) of NCU's unlearning stage for unit-norm embeddings; the gradient flows through all three."""
  n = image.shape[0]
  sim = torch.cat([image @ text.T, (image * neg_text).sum(dim=1, keepdim=True)], dim=1)   # S_ext, N x (N+1)
  with torch.no_grad():
    cost = 1.0 - sim
    top = cost.max()
    idx = torch.arange(n, device=image.device)
    mask = torch.ones(n, n + 1, dtype=torch.bool, device=image.device)
    mask[idx, idx] = ~forget              # a forget image may not keep its own text ...
    mask[:, n] = forget                   # ... and only forget images may send mass to the negative column
    identity = torch.zeros(n, n + 1, dtype=sim.dtype, device=image.device)
    identity[idx, idx] = (~forget).to(sim.dtype)
    identity[:, n] = forget.to(sim.dtype)
    p = torch.full((n,), 1.0 / n, dtype=sim.dtype, device=image.device)
    q = torch.full((n + 1,), 1.0 / (n + 1), dtype=sim.dtype, device=image.device)
    plan_img, it_img = sinkhorn(cost / top, mask, p, q)
    plan_txt, it_txt = sinkhorn(cost.T / top, mask.T, q, p)
    targets_img = KAPPA * plan_img / plan_img.sum(dim=1, keepdim=True) + (1 - KAPPA) * identity
    targets_txt = KAPPA * plan_txt / plan_txt.sum(dim=1, keepdim=True) + (1 - KAPPA) * identity.T
  logits = math.exp(logit_scale) * sim
  loss_img = F.kl_div(F.log_softmax(logits, dim=1), targets_img, reduction="batchmean")       # / N
  loss_txt = F.kl_div(F.log_softmax(logits.T, dim=1), targets_txt, reduction="batchmean")     # / (N + 1)
  loss_ul = 0.5 * (loss_img + loss_txt)
  cosine = (text * neg_text).sum(dim=1)
  loss_band = (F.relu(cosine - BAND[1]) + F.relu(BAND[0] - cosine)).mean()
  terms = dict(loss_img=loss_img.item(), loss_txt=loss_txt.item(), loss_ul=loss_ul.item(),
               loss_band=loss_band.item(), iterations=(it_img, it_txt), forget=forget)
  return loss_ul + loss_band, terms


def crosscheck(expected: dict, inputs) -> dict:
  """This restatement on methods.md §1.7's inputs (float64, CPU): the largest absolute difference from the notes'
  loss terms, and whether the forget set and iteration counts agree."""
  image, text, neg_text = (torch.as_tensor(x, dtype=torch.float64) for x in inputs)
  forget = select_forget(image, text, math.log(1 / 0.07), expected["ratio"])
  _, terms = stage2_loss(image, text, neg_text, math.log(1 / 0.07), forget)
  diff = max(abs(terms[k] - expected[k]) for k in ("loss_img", "loss_txt", "loss_ul", "loss_band"))
  return dict(max_abs_diff=diff, forget=tuple(torch.nonzero(forget).flatten().tolist()),
              iterations=terms["iterations"],
              same_forget=tuple(torch.nonzero(forget).flatten().tolist()) == tuple(expected["forget"]),
              same_iterations=tuple(terms["iterations"]) == tuple(expected["iterations"]))
