"""Linear layers that read their weight from a bf16 shadow of the flat fp32 parameters.

Under bf16 autocast every ``nn.Linear`` casts its fp32 weight to bf16 once per forward
(autocast's weight cache), one small copy kernel per weight: ~40 launches per step for the
FastTransformer (its copies and casts are a visible category of the engine's step in
``benchmarks/kernels/engine_probe.py``'s profile). The engine keeps the fp32 master weights in one flat
buffer (``ftlib.training.engine.flat.flatten_parameters_``), so one copy of that buffer into a bf16 shadow at the
start of the step gives every weight its bf16 version in a single kernel; :class:`ShadowLinear`
then runs on that view.

The arithmetic is autocast's (Micikevicius et al. 2018, mixed precision with fp32 master
weights): with x (M, K), W (N, K) fp32 master, W16 = bf16(W), x16 = bf16(x), dy (M, N) bf16:
    forward   y  = x16 W16^T + bf16(b)              bf16 GEMM, fp32 accumulation
    backward  dx = dy W16                            bf16
              dW = dy^T x16                          bf16, cast to fp32 into the flat gradient
              db = sum_rows dy                       bf16, cast to fp32
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class ShadowLinearFunction(torch.autograd.Function):
    """y = bf16(x) W16^T + bf16(b); the fp32 ``weight`` is an input only so its gradient lands in
    its ``.grad`` (autograd casts the bf16 dW to the weight's fp32, as it does under autocast)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                w16: torch.Tensor) -> torch.Tensor:
        x16 = x.to(torch.bfloat16)  # a no-op when the producer already wrote bf16
        b16 = bias.to(torch.bfloat16) if bias is not None else None
        with torch.autocast(x.device.type, enabled=False):
            y = F.linear(x16, w16, b16)
        ctx.save_for_backward(x16, w16)
        ctx.has_bias = bias is not None
        ctx.x_dtype = x.dtype
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x16, w16 = ctx.saved_tensors
        dy16 = dy.to(torch.bfloat16)
        dy2 = dy16.reshape(-1, dy16.shape[-1])  # (M, N)
        dx = dw = db = None
        with torch.autocast(dy.device.type, enabled=False):
            if ctx.needs_input_grad[0]:
                dx = (dy16 @ w16).to(ctx.x_dtype)  # (..., K)
            if ctx.needs_input_grad[1]:
                dw = dy2.t() @ x16.reshape(-1, x16.shape[-1])  # (N, K), bf16
            if ctx.has_bias and ctx.needs_input_grad[2]:
                db = dy2.sum(0)
        return dx, dw, db, None


class ShadowLinear(nn.Module):
    """Takes over an ``nn.Linear`` (the same Parameter objects) and, in training mode with
    gradients on, runs it on ``w16``: a bf16 view kept equal to bf16(weight) by its owner
    (``ftlib.training.engine.Engine`` copies the flat buffer at the start of every step). Only
    meaningful under bf16 autocast."""

    def __init__(self, lin: nn.Linear, w16: torch.Tensor) -> None:
        super().__init__()
        if w16.shape != lin.weight.shape or w16.dtype != torch.bfloat16:
            raise ValueError(f"w16 must be bf16 of shape {tuple(lin.weight.shape)}; got {w16.dtype} "
                             f"{tuple(w16.shape)}")
        self.weight, self.bias = lin.weight, lin.bias
        self.in_features, self.out_features = lin.in_features, lin.out_features
        self.w16 = w16  # a plain attribute, not a buffer: it is a view into the engine's shadow

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            return ShadowLinearFunction.apply(x, self.weight, self.bias, self.w16)
        # Outside the training step (evaluation, sampling) an ordinary Linear: the shadow is
        # refreshed at the start of each step, so after an update it is one step behind.
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, bf16 shadow")
