"""Linear layers whose weight gradient is written straight into the engine's flat fp32 gradient.

Every parameter's ``.grad`` is a view into one flat fp32 buffer (:mod:`ftlib.training.engine.flat`),
so for each Linear weight autograd runs the weight-gradient GEMM into a new tensor and then
AccumulateGrad adds that tensor into the view: one add kernel per weight, and under bf16 autocast
first a bf16 -> fp32 cast of the gradient (a copy kernel). Megatron-LM's gradient accumulation
fusion (``LinearWithGradAccumulationAndAsyncCommunication`` in
``megatron/core/tensor_parallel/layers.py``, option ``gradient_accumulation_fusion``) removes both:
its backward runs the weight-gradient GEMM into the fp32 ``main_grad`` itself and returns no
gradient for the weight. :class:`GradIntoLinearFunction` does the same with one GEMM call:

With x (M, K), W (N, K) fp32 master, b (N,), dy (M, N), G the weight's (N, K) view of the flat grad:
    forward   y  = x W^T + b                      F.linear (autocast's casts made explicitly)
    backward  dx = dy W                           torch.mm, returned to autograd
              G  = dy^T x                         torch.mm(dy^T, x, out=G): written, not added
              db = sum_rows dy                    returned to autograd (AccumulateGrad adds it), or, with
                                                  ``db_out`` (option bias_into_buffer), added into the
                                                  bias's view by the column sum's atomic adds, None returned
              dW = None                           AccumulateGrad is still reached, with nothing to add

fp32 and tf32: ``torch.mm(..., out=G)`` is the GEMM autograd runs for ``F.linear`` (its mm backward
computes ``dy^T x`` for a weight stored (N, K)), so G holds bit for bit what autograd's path (the option off) adds
into a zeroed view. bf16 / fp16 autocast: on CUDA ``torch.mm(dy16^T, x16, out_dtype=torch.float32,
out=G)`` (cuBLAS with bf16 operands and an fp32 output: the cast kernel goes too, and dW is no
longer rounded to bf16 before it reaches fp32); where that overload has no kernel (the CPU) the
bf16 GEMM's result is copied into G, one copy in place of autograd's cast plus add.

Write, not accumulate. The engine zeroes the flat gradient with one memset at the start of every
step and runs one backward per step (no gradient accumulation over micro-steps), and each wrapped
weight is used by one Linear, so its view receives exactly one contribution: writing it is what
adding it to zeros gives. The one shared weight handled is the tied head of ``GPT`` (``tie_weights``:
``head.weight is wte.weight``): the head writes its GEMM into the view and the embedding's
contribution is then added by AccumulateGrad, as before. The order is fixed by the graph: the
embedding's output feeds every later layer, so autograd can only run the embedding's backward
after the head's backward has produced dh, and the head writes G before it returns dh. A weight
shared by two Linears is left on autograd (``linears.grad_into_linears`` says which).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from kernels.mm_into import weight_grad_into_

if TYPE_CHECKING:
    from ftlib.training.engine.options import EngineOptions
    from ftlib.training.engine.wgrad_stream import WGradStream

# db (N,) in the bias dtype from dy (M, N); None: dy.sum(0), cast by autograd like autocast's.
BiasGrad = Callable[[torch.Tensor], torch.Tensor] | None
# (grad, dy2, x2) -> None, adding dy2^T x2 into grad; None: written by kernels.mm_into.weight_grad_into_.
AddWGrad = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object] | None


def grad_views(who: str, *params: nn.Parameter | None) -> list[torch.Tensor | None]:
    """Each parameter's ``.grad`` (None for a missing parameter): the engine's flat-gradient views, which the
    kernels add into; a RuntimeError where one is None."""
    grads = [p.grad if p is not None else None for p in params]
    if any(p is not None and g is None for p, g in zip(params, grads)):
        raise RuntimeError(f"{who} needs each parameter's .grad to be its gradient buffer (the engine's "
                           "flat-gradient views); it is None")
    return grads


def bias_sum_why_not(options: EngineOptions, notes: dict[str, str]) -> str | None:
    """Why another kernel cannot add a Linear's bias gradient in its place (options branch_bias_into_norm,
    qkv_bias_into_attention, fc_bias_into_gelu), or None: the Linear must be on the bias kernel (its note in
    ``notes``) and write into the flat gradient, so that its own column sum can be skipped."""
    if options.grad_into_buffer and notes.get("bias", "").startswith("bias gradients"):
        return None
    return "not applied: needs grad_into_buffer and the bias kernel"


class GradIntoLinearFunction(torch.autograd.Function):
    """y = x W^T + b whose backward writes dW into ``grad`` and returns None for ``weight``.

    ``w16``: a bf16 copy of the weight kept by the engine (:mod:`ftlib.training.engine.bf16_weights`),
    read instead of casting ``weight`` under autocast; ``b16`` likewise for the bias. ``bias_grad``: see
    :data:`BiasGrad`. ``db_out``: instead, the bias's view of the flat gradient (zeroed before the backward),
    into which the column sum of dy is added (:func:`kernels.bias_linear.bias_grad_add_`); None is returned
    for the bias then. ``db_elsewhere``: the bias's gradient is added into the flat gradient by the kernel that
    makes dy (option branch_bias_into_norm): nothing is computed or returned for it here.
    ``fp32_out``: low-precision GEMMs may write fp32 directly (:func:`kernels.mm_into.fp32_out_mm_available`).
    ``add_wgrad``: instead, a function (grad, dy2, x2) that *adds* dy2^T x2 into ``grad`` (the split-K
    kernel, :func:`kernels.wgrad.wgrad_add_`), for a ``grad`` zeroed before the backward, as the engine's is.
    ``wgrad_stream``: where given, the weight-gradient GEMM (and the bias gradient's add with ``db_out``) is
    queued on that side stream (:mod:`ftlib.training.engine.wgrad_stream`), whose owner joins it before the
    gradients are read.
    Saves x and the weight in the dtype the GEMMs ran in, as ``F.linear`` under autocast does.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, grad: torch.Tensor,
                w16: torch.Tensor | None, bias_grad: BiasGrad, fp32_out: bool, add_wgrad: AddWGrad,
                b16: torch.Tensor | None = None, db_out: torch.Tensor | None = None,
                db_elsewhere: bool = False, wgrad_stream: WGradStream | None = None) -> torch.Tensor:
        dev = x.device.type
        ctx.x_dtype = x.dtype
        wc = weight
        if torch.is_autocast_enabled(dev):  # autocast's casts for F.linear, made here for the backward
            low = torch.get_autocast_dtype(dev)
            x = x.to(low)  # a no-op when the producer already wrote bf16
            wc = w16 if w16 is not None else weight.to(low)
            if bias is not None:
                bias = b16 if b16 is not None else bias.to(low)
        with torch.autocast(dev, enabled=False):
            y = F.linear(x, wc, bias)
        ctx.save_for_backward(x, wc)
        ctx.grad, ctx.bias_grad, ctx.fp32_out, ctx.has_bias = grad, bias_grad, fp32_out, bias is not None
        ctx.add_wgrad, ctx.db_out, ctx.db_elsewhere = add_wgrad, db_out, db_elsewhere
        ctx.wgrad_stream = wgrad_stream
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, wc = ctx.saved_tensors
        N, K = wc.shape
        dy2 = dy.to(wc.dtype).reshape(-1, N)  # (..., N) -> (M, N)
        dx = db = None
        # A CPU backward called inside an autocast region would otherwise recast the GEMMs.
        with torch.autocast(dy.device.type, enabled=False):
            x2 = x.reshape(-1, K)  # x: (..., K) -> (M, K)
            # What only the flat gradient receives (the optimizer reads it after the backward): dW, and db
            # where it is added there; on the side stream where one is given, else after dx.
            into_flat = []
            if ctx.needs_input_grad[1]:
                into_flat.append(partial(ctx.add_wgrad, ctx.grad, dy2, x2) if ctx.add_wgrad is not None
                                 else partial(weight_grad_into_, ctx.grad, dy2, x2, ctx.fp32_out))
            if not ctx.db_elsewhere and ctx.has_bias and ctx.needs_input_grad[2] and ctx.db_out is not None:
                from kernels.bias_linear import bias_grad_add_  # here: importing this module imports no Triton

                into_flat.append(partial(bias_grad_add_, dy2, ctx.db_out))  # db added into the bias's view
            if into_flat and ctx.wgrad_stream is not None:  # forked first: it may start beside dx's GEMM
                ctx.wgrad_stream.run(partial(_run_all, into_flat), dy2, x2)
                into_flat = []
            if ctx.needs_input_grad[0]:
                dx = torch.mm(dy2, wc).view(*dy.shape[:-1], K).to(ctx.x_dtype)  # (M, N) @ (N, K) -> (..., K)
            _run_all(into_flat)
            # db_elsewhere: the bias's gradient is added where dy is made (the residual-norm backward).
            if not ctx.db_elsewhere and ctx.has_bias and ctx.needs_input_grad[2] and ctx.db_out is None:
                db = dy2.sum(0) if ctx.bias_grad is None else ctx.bias_grad(dy2)  # (N,)
        return dx, None, db, None, None, None, None, None, None, None, None, None


def _run_all(work: list[Callable[[], object]]) -> None:
    for w in work:
        w()


def _check_view(name: str, t: torch.Tensor, p: torch.Tensor, dtype: torch.dtype) -> None:
    """ValueError unless ``t`` is a ``dtype`` tensor of ``p``'s shape on ``p``'s device."""
    if t.shape != p.shape or t.dtype != dtype or t.device != p.device:
        short = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
        raise ValueError(f"{name} must be {short} of shape {tuple(p.shape)} on {p.device}; got {t.dtype} "
                         f"{tuple(t.shape)} on {t.device}")


class GradIntoLinear(nn.Module):
    """Takes over a Linear (``nn.Linear``, the bf16-shadow ``ShadowLinear`` or the bias-kernel
    ``BiasLinear``: the same Parameter objects) and, in training mode with gradients on, runs it on
    :class:`GradIntoLinearFunction` with ``grad``, the weight's view of the flat gradient.
    ``w16`` and ``bias_grad`` keep what the replaced layer did (its bf16 shadow, its bias kernel).
    Outside the training step (evaluation, sampling) an ordinary Linear on the fp32 weights."""

    def __init__(self, lin: nn.Module, grad: torch.Tensor, *, w16: torch.Tensor | None = None,
                 bias_grad: BiasGrad = None, fp32_out: bool = False, add_wgrad: AddWGrad = None,
                 b16: torch.Tensor | None = None, db_out: torch.Tensor | None = None,
                 db_elsewhere: bool = False, wgrad_stream: WGradStream | None = None) -> None:
        super().__init__()
        w, b = lin.weight, lin.bias
        _check_view("grad", grad, w, torch.float32)
        if (b16 is not None or db_out is not None or db_elsewhere) and b is None:
            raise ValueError("b16, db_out and db_elsewhere are for a Linear with a bias; this one has none")
        if db_out is not None and db_elsewhere:
            raise ValueError("db_out and db_elsewhere exclude each other: the bias gradient is added once")
        if b16 is not None:
            _check_view("b16", b16, b, torch.bfloat16)
        if db_out is not None:
            _check_view("db_out", db_out, b, torch.float32)
        self.weight, self.bias = w, b
        self.in_features, self.out_features = lin.in_features, lin.out_features
        # Plain attributes, not buffers: views into the engine's flat gradient and bf16 shadow.
        self.grad, self.w16, self.b16, self.db_out, self.db_elsewhere = grad, w16, b16, db_out, db_elsewhere
        self.bias_grad, self.fp32_out, self.add_wgrad = bias_grad, fp32_out, add_wgrad
        self.wgrad_stream = wgrad_stream

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            return GradIntoLinearFunction.apply(x, self.weight, self.bias, self.grad, self.w16, self.bias_grad,
                                                self.fp32_out, self.add_wgrad, self.b16, self.db_out,
                                                self.db_elsewhere, self.wgrad_stream)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, dW into the flat gradient"
                + (", bf16 shadow" if self.w16 is not None else "")
                + (", bias kernel" if self.bias_grad is not None else "")
                + (", db into the flat gradient" if self.db_out is not None else "")
                + (", db added by the residual-norm backward" if self.db_elsewhere else "")
                + (", dW on the side stream" if self.wgrad_stream is not None else ""))
