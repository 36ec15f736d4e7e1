"""Muon for the hidden matrices, AdamW for the rest: the optimizer the speedrun tries.

Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks";
``torch.optim.Muon``) keeps a momentum buffer per matrix, then replaces the update by an
approximately orthogonal matrix with the same row and column spaces: five Newton-Schulz
iterations of a quintic whose coefficients (3.4445, -4.7750, 2.0315) maximize the slope at zero.
Every singular value of the update lands near 1, so every direction of a matrix learns at a
similar rate. It is meant for the 2-D weights inside the blocks; embeddings, the output head and
the norms' gains keep AdamW (the public speedruns' split, e.g. modded-nanogpt).

Two ways to run it, one computation:

* :func:`make_muon_adamw` builds ``torch.optim.Muon`` for the block matrices and
  ``torch.optim.AdamW`` for everything else, behind one optimizer interface
  (:class:`MuonAdamW`), for the eager and compiled steps.
* :func:`muon_update_` is the same update written with the learning rate as a device tensor,
  so a captured CUDA graph replays it with the learning rate of the current step (the engine).
  Tests hold it to ``torch.optim.Muon`` step for step.
* :func:`muon_update_grouped_` computes the same update with matrices of one shape stacked: one
  batched Newton-Schulz per shape instead of one per matrix, and the momentum, decay and update
  as multi-tensor (``torch._foreach_*``) launches. A small model's matrices are too small to fill
  the GPU one at a time, so the per-matrix update is a few hundred short kernels; grouped, it is a
  few dozen. The batched products may sum in another order, so it matches the per-matrix update
  to bf16 rounding, not bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
import torch.nn as nn

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Jordan et al. 2024; torch.optim.Muon's defaults
NS_STEPS = 5
NS_EPS = 1e-7


def is_muon_param(name: str, p: torch.Tensor) -> bool:
    """Muon takes the 2-D weights inside the transformer blocks: not the embeddings, not the head."""
    return p.ndim == 2 and ".blocks." in f".{name}"


def split_params(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(Muon's parameters, AdamW's parameters), each in the model's order."""
    muon, rest = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (muon if is_muon_param(name, p) else rest).append(p)
    if not muon:
        raise ValueError("no 2-D weight inside model.blocks: Muon has nothing to optimize")
    return muon, rest


def lr_scale(shape: Sequence[int]) -> float:
    """Keller Jordan's shape factor sqrt(max(1, rows / cols)) (torch.optim.Muon's 'original')."""
    rows, cols = shape[0], shape[1]
    return math.sqrt(max(1.0, rows / cols))


def orthogonalize(g: torch.Tensor, steps: int = NS_STEPS, eps: float = NS_EPS) -> torch.Tensor:
    """Newton-Schulz iteration towards U V^T of g = U S V^T, in bf16 as torch.optim.Muon runs it.

    X <- X / ||X||_F (so the spectral norm is at most 1); then ``steps`` times
    A = X X^T, B = b A + c A A, X <- a X + B X, on the wider orientation (X^T when rows > cols).
    """
    a, b, c = NS_COEFFICIENTS
    x = g.bfloat16()
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T  # (r, r), r = min(rows, cols)
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def orthogonalize_batched(g: torch.Tensor, steps: int = NS_STEPS, eps: float = NS_EPS) -> torch.Tensor:
    """:func:`orthogonalize` of each matrix of a stack ``g`` of shape (n, rows, cols), in one batch."""
    a, b, c = NS_COEFFICIENTS
    x = g.bfloat16()
    tall = g.size(1) > g.size(2)
    if tall:
        x = x.mT  # (n, cols, rows): the wider orientation, as orthogonalize takes it
    x = x / x.norm(dim=(1, 2), keepdim=True).clamp(min=eps)  # each matrix by its own Frobenius norm
    for _ in range(steps):
        gram = torch.bmm(x, x.mT)  # (n, r, r), r = min(rows, cols)
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def muon_update_grouped_(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
                         bufs: Sequence[torch.Tensor], lr: torch.Tensor, weight_decay: float = 0.1,
                         momentum: float = 0.95, nesterov: bool = True) -> None:
    """:func:`muon_update_` with the matrices of each shape orthogonalized together (module docstring).

    ``lr`` is a 0-dim device tensor; every tensor of a list shares one dtype and device."""
    if any(p.ndim != 2 for p in params):
        raise ValueError(f"Muon updates 2-D matrices, got shapes {sorted({tuple(p.shape) for p in params})}")
    if lr.ndim != 0:
        raise ValueError(f"lr must be a 0-dim tensor (the multi-tensor ops take no other), got shape {tuple(lr.shape)}")
    params, grads, bufs = list(params), list(grads), list(bufs)
    torch._foreach_lerp_(bufs, grads, 1 - momentum)
    updates = torch._foreach_lerp(grads, bufs, momentum) if nesterov else bufs
    torch._foreach_mul_(params, 1 - lr * weight_decay)
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, p in enumerate(params):
        by_shape.setdefault(tuple(p.shape), []).append(i)
    for shape, idx in by_shape.items():
        o = orthogonalize_batched(torch.stack([updates[i] for i in idx]))  # (n, rows, cols)
        # lr is a dimensioned fp32 tensor here, so the product is fp32: o.to(fp32) * lr * scale, once.
        step = (o * (lr * lr_scale(shape)).reshape(1, 1, 1)).to(params[idx[0]].dtype).contiguous()
        torch._foreach_sub_([params[i] for i in idx], list(step.unbind(0)))


def muon_update_(params: Iterable[torch.Tensor], grads: Iterable[torch.Tensor], bufs: Iterable[torch.Tensor],
                 lr: torch.Tensor, weight_decay: float = 0.1, momentum: float = 0.95, nesterov: bool = True) -> None:
    """One Muon step in place, ``lr`` a 1-element device tensor (so it can change between graph replays).

    Per matrix: buf <- lerp(buf, g, 1 - momentum); u = lerp(g, buf, momentum) (Nesterov) or buf;
    p <- p (1 - lr wd); p <- p - lr sqrt(max(1, rows/cols)) orthogonalize(u). The order and the
    formulas are torch.optim.Muon's.
    """
    for p, g, buf in zip(params, grads, bufs):
        if p.ndim != 2:
            raise ValueError(f"Muon updates 2-D matrices, got a parameter of shape {tuple(p.shape)}")
        buf.lerp_(g, 1 - momentum)
        u = g.lerp(buf, momentum) if nesterov else buf
        o = orthogonalize(u).to(p.dtype)
        p.mul_(1 - lr * weight_decay)
        p.sub_(o * (lr * lr_scale(p.shape)))


class MuonAdamW:
    """``torch.optim.Muon`` for the block matrices and ``torch.optim.AdamW`` for the rest, as one optimizer.

    Its ``param_groups`` are both optimizers' groups (Muon's first), each with its own ``lr``:
    a learning-rate schedule that scales every group's base rate by the same factor
    (``initial_lr`` in each group) drives both.
    """

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer) -> None:
        self.muon, self.adamw = muon, adamw
        self.param_groups = muon.param_groups + adamw.param_groups  # shared dicts: lr changes reach both
        for g in self.param_groups:
            g.setdefault("initial_lr", g["lr"])

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    @torch.no_grad()
    def step(self, closure: None = None) -> None:
        if closure is not None:
            raise ValueError("MuonAdamW.step takes no closure")
        self.muon.step()
        self.adamw.step()

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])


def make_muon_adamw(model: nn.Module, muon_lr: float, adamw_lr: float, betas: tuple[float, float] = (0.9, 0.99),
                    weight_decay: float = 0.0, muon_weight_decay: float = 0.0, momentum: float = 0.95,
                    fused: bool | None = None) -> MuonAdamW:
    """Muon (``muon_lr``, Nesterov momentum ``momentum``) for the block matrices, AdamW (``adamw_lr``)
    for embeddings, head and gains; AdamW decays only matrices (the embeddings and head), as
    ``ftlib.training.step.param_groups`` does."""
    muon_params, rest = split_params(model)
    muon = torch.optim.Muon(muon_params, lr=muon_lr, weight_decay=muon_weight_decay, momentum=momentum,
                            nesterov=True, adjust_lr_fn="original")
    decay = [p for p in rest if p.ndim >= 2]
    no_decay = [p for p in rest if p.ndim < 2]
    kw = {} if fused is None else {"fused": fused}
    adamw = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}], lr=adamw_lr, betas=betas, **kw)
    return MuonAdamW(muon, adamw)
