"""A norm with no residual add before it, its backward on the fused residual-norm kernel, its weight (and
bias) gradients added into given buffers.

launchers (``layer_norm_fwd`` / ``rms_norm_fwd``, then ``add_norm_bwd`` with no residual gradient) ->
``NormIntoFunction`` -> :func:`norm_into`. References: :func:`ftlib.model.reference.layer_norm_ref`,
:func:`ftlib.model.reference.rms_norm_ref`. Used by ``ftlib.training.engine`` (option
``first_norm_into_buffer``) for the first block's first norm, the one norm of a pre-norm transformer that no
residual add precedes: every other norm already runs on :mod:`kernels.residual_norm` with its weight gradient
added into the engine's flat gradient.

Why: that one norm otherwise runs its own kernels' backward. The LayerNorm kernel's takes one row per loop
iteration on one program per SM (latency-bound at (8192, 256): several times the fused residual-norm's time
for the same rows, in GPT-2's step profile, ``benchmarks/kernels/engine_probe.py``), and both norm kernels
leave partial rows for a torch sum and autograd's add per parameter. The fused residual-norm's backward with
no incoming residual gradient is exactly this norm's backward: with ``s`` the norm's input and ``shat`` the
normalized row (RMSNorm, Zhang & Sennrich 2019; LayerNorm, Ba et al. 2016),

    forward    h = shat w (+ b)                                       the norm's own forward kernel
    backward   dx = rstd (dh w - [mean(dh w)] - shat mean(dh w shat))  ([.] LayerNorm only)
               dw_out += sum_rows dh shat;   db_out += sum_rows dh      atomic adds, in no fixed order

on 2-D row tiles with a persistent grid (:func:`kernels.residual_norm.add_norm_bwd`, ``dw_partials="atomic"``);
the LayerNorm mean is recomputed from the saved input. ``dw_out`` and ``db_out`` must be zeroed by the caller
when the gradient is to be written (the engine zeroes its flat gradient once per step).
"""

from __future__ import annotations

import torch

from kernels._common import accum_dtype, check_atomic_sem, check_tensor
from kernels.layernorm import layer_norm_fwd
from kernels.residual_norm import ROWS, _check_outs, add_norm_bwd
from kernels.rmsnorm import rms_norm_fwd


class NormIntoFunction(torch.autograd.Function):
    """Saves the input, the weight and rstd; returns no gradient for the weight and bias (added into
    ``dw_out`` and ``db_out`` by the backward kernel)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float, layer_norm: bool,
                dw_out: torch.Tensor, db_out: torch.Tensor | None, rows: int, programs: int | None,
                loop_stages: int | None = None, sem: str = "acq_rel") -> torch.Tensor:
        x = x.contiguous()  # the backward kernel reads the rows at stride N
        if layer_norm:
            y, _, rstd = layer_norm_fwd(x, w, b, eps)
        else:
            y, rstd = rms_norm_fwd(x, w, eps)
        ctx.save_for_backward(x, w, rstd)
        ctx.layer_norm, ctx.has_bias, ctx.rows, ctx.programs = layer_norm, b is not None, rows, programs
        ctx.dw_out, ctx.db_out, ctx.loop_stages, ctx.sem = dw_out, db_out, loop_stages, sem
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, w, rstd = ctx.saved_tensors
        dx, _, _, _ = add_norm_bwd(None, dy, x, w, rstd, ctx.layer_norm, ctx.has_bias, ctx.rows,
                                   dw_partials="atomic", programs=ctx.programs, dw_out=ctx.dw_out, db_out=ctx.db_out,
                                   loop_stages=ctx.loop_stages, sem=ctx.sem)
        return dx, None, None, None, None, None, None, None, None, None, None


def norm_into(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float, layer_norm: bool,
              dw_out: torch.Tensor, db_out: torch.Tensor | None = None, rows: int = ROWS,
              programs: int | None = None, loop_stages: int | None = None, sem: str = "acq_rel") -> torch.Tensor:
    """LayerNorm (``layer_norm``; optional bias ``b``) or RMSNorm (no bias) of x over its last dim, differentiable
    in x; the backward adds the weight's gradient into ``dw_out`` (and the bias's into ``db_out``, exactly when
    there is a bias), (N,) buffers in the accumulation dtype of x (fp32; fp64 for fp64 x). ``rows``, ``programs``:
    the backward's row tiles and grid (:func:`kernels.residual_norm.add_norm_bwd`; None: a few programs per SM);
    ``loop_stages``: its loop over the tiles pipelined (None: not); ``sem``: the memory order of its atomic adds
    (:data:`kernels._common.ATOMIC_SEMS`)."""
    check_tensor("x", x, contiguous=False)
    if b is not None and not layer_norm:
        raise ValueError("a bias is only defined for LayerNorm (layer_norm=True)")
    _check_outs("atomic", dw_out, db_out, w, accum_dtype(x.dtype), b is not None)  # now, not first in the backward
    check_atomic_sem(sem)
    return NormIntoFunction.apply(x, w, b, eps, layer_norm, dw_out, db_out, rows, programs, loop_stages, sem)
