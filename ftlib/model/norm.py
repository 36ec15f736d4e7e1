"""Normalization layers: LayerNorm (GPT-2) and RMSNorm (FastTransformer).

These are the plain-PyTorch reference implementations. Hand-written kernels in
``kernels/`` are tested against :func:`rms_norm_ref` and :func:`layer_norm_ref`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def layer_norm_ref(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """LayerNorm over the last dim (Ba et al. 2016): (x - mean) / sqrt(var + eps) * w + b.

    Two reductions per row (mean, then variance), the "two-pass barrier" of the post.
    """
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019, eq. 4): x / sqrt(mean(x^2) + eps) * w.

    One reduction per row and no mean-centering. Computed in at least float32 so
    that bf16/fp16 inputs do not lose the sum of squares; the result is cast back.
    """
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = y.to(x.dtype)
    return y * weight if weight is not None else y


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's nn.LayerNorm always has one)."""

    def __init__(self, dim: int, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm_ref(x, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm with a learned gain and no bias, as in FastTransformer."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_ref(x, self.weight, self.eps)


def make_norm(kind: str, dim: int, bias: bool, eps: float) -> nn.Module:
    """Build the norm a config names ('layernorm' or 'rmsnorm')."""
    if kind == "layernorm":
        return LayerNorm(dim, bias=bias, eps=eps)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps)
    raise ValueError(f"unknown norm {kind!r}; expected 'layernorm' or 'rmsnorm'")
