"""Residual add fused with the RMSNorm that follows it, forward and backward (pre-norm blocks).

kernels (``_add_rms_fwd_kernel``, ``_add_rms_bwd_kernel``) -> launchers (``add_rms_norm_fwd``,
``add_rms_norm_bwd``) -> ``AddRMSNormFunction`` -> :func:`add_rms_norm`. Reference:
:func:`ftlib.reference.add_rms_norm_ref`. Used by ``ftlib.engine`` with
``fuse_residual_norm=True`` (off by default until measured on a GPU).

In a pre-norm block every residual add is followed by a norm: ``s = x + r; h = norm(s)``,
and ``s`` feeds both the norm and the next residual add. Unfused that is an add kernel and
a norm kernel forward, and backward autograd adds the two gradients reaching ``s`` (one
more kernel) before the norm's backward. Fused, per (ROWS, N) tile:

    forward    s = x + r;  rstd = 1 / sqrt(mean(s^2) + eps);  h = s * rstd * w
    backward   g = ds + rstd * (dh w - shat * mean(dh w shat)),  shat = s * rstd
               dx = dr = g;   dw = sum_rows dh shat   (per-program partials, summed after)

where ``ds`` is the gradient reaching ``s`` from the next residual add and ``dh`` the one
reaching the norm's output (Zhang & Sennrich 2019 for the RMSNorm terms). One kernel each
way instead of two forward and three backward; rows are processed in tiles of ROWS so the
loads of a tile are in flight together (the row-per-program kernel of ``kernels/rmsnorm.py``
is latency-bound in a graph: kernels/dev/NOTES.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check_tensor, compute_dtype, same_device

ROWS = 16  # rows per program: 16 x 256 fp32 = 16 KB per operand tile


@triton.jit
def _add_rms_fwd_kernel(X, R, W, S, H, RSTD, M, N, eps,
                        ROWS: tl.constexpr, BLOCK_N: tl.constexpr, CD: tl.constexpr):
    """s = x + r (stored), rstd = 1 / sqrt(mean_j s_j^2 + eps) (stored), h = s rstd w (stored)."""
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    mask = rmask[:, None] & (cols[None, :] < N)
    off = rows[:, None] * N + cols[None, :]
    s = tl.load(X + off, mask=mask, other=0.0).to(CD) + tl.load(R + off, mask=mask, other=0.0).to(CD)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(CD)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=1) / N + eps)
    tl.store(S + off, s.to(S.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=rmask)
    tl.store(H + off, (s * rstd[:, None] * w[None, :]).to(H.dtype.element_ty), mask=mask)


@triton.jit
def _add_rms_bwd_kernel(DS, DH, S, W, RSTD, G, DWP, M, N,
                        HAS_DS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, CD: tl.constexpr):
    """g = ds + rstd (dh w - shat mean(dh w shat)) for the tile; dweight partial into DWP[pid]."""
    pid = tl.program_id(0)
    rows = (pid * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    mask = rmask[:, None] & (cols[None, :] < N)
    off = rows[:, None] * N + cols[None, :]
    s = tl.load(S + off, mask=mask, other=0.0).to(CD)
    dh = tl.load(DH + off, mask=mask, other=0.0).to(CD)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(CD)
    rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
    shat = s * rstd[:, None]
    dhw = dh * w[None, :]
    c = tl.sum(dhw * shat, axis=1) / N
    g = rstd[:, None] * (dhw - shat * c[:, None])
    if HAS_DS:
        g += tl.load(DS + off, mask=mask, other=0.0).to(CD)
    tl.store(G + off, g.to(G.dtype.element_ty), mask=mask)
    tl.store(DWP + pid * N + cols, tl.sum(dh * shat, axis=0), mask=cols < N)


def _check(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> None:
    check_tensor("x", x)
    check_tensor("r", r)
    check_tensor("weight", w, ndim=1)
    same_device(("x", x), ("r", r), ("weight", w))
    if x.shape != r.shape:
        raise ValueError(f"x and r must have one shape: {tuple(x.shape)} vs {tuple(r.shape)}")
    if x.shape[-1] != w.shape[0]:
        raise ValueError(f"x's last dim {x.shape[-1]} != weight's length {w.shape[0]}")


def add_rms_norm_fwd(
    x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(s, h, rstd): s = x + r, h = rms_norm(s) * w over the last dim; contiguous x and r.

    s and h take x's dtype (the residual stream's; under bf16 autocast r may be bf16 and is
    added in fp32 inside the kernel, as ``x + r`` would promote it).
    """
    _check(x, r, w)
    N = x.shape[-1]
    M = x.numel() // max(N, 1)
    s, h = torch.empty_like(x), torch.empty_like(x)
    rstd = torch.empty(M, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32, device=x.device)
    block_n = triton.next_power_of_2(N)
    if M > 0:
        _add_rms_fwd_kernel[(triton.cdiv(M, ROWS),)](x, r, w, s, h, rstd, M, N, eps, ROWS=ROWS, BLOCK_N=block_n,
                                                    CD=compute_dtype(x.dtype), num_warps=4)
    return s, h, rstd


def add_rms_norm_bwd(
    ds: torch.Tensor | None, dh: torch.Tensor, s: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, dweight): g is the gradient of both x and r; ``ds`` None when s feeds only the norm."""
    N = s.shape[-1]
    M = s.numel() // max(N, 1)
    dh = dh.contiguous()
    ds = ds.contiguous() if ds is not None else None
    g = torch.empty_like(s)
    grid = triton.cdiv(M, ROWS)
    dwp = torch.empty((max(grid, 1), N), dtype=rstd.dtype, device=s.device)
    if M == 0:
        return g, torch.zeros_like(w)
    _add_rms_bwd_kernel[(grid,)](ds if ds is not None else dh, dh, s, w, rstd, g, dwp, M, N,
                                 HAS_DS=ds is not None, ROWS=ROWS, BLOCK_N=triton.next_power_of_2(N),
                                 CD=compute_dtype(s.dtype), num_warps=4)
    return g, dwp.sum(0).to(w.dtype)


class AddRMSNormFunction(torch.autograd.Function):
    """Two outputs, (s, h); autograd hands the backward both gradients, so their sum is fused."""

    @staticmethod
    def forward(ctx, x, r, w, eps):
        s, h, rstd = add_rms_norm_fwd(x.contiguous(), r.contiguous(), w, eps)
        ctx.save_for_backward(s, w, rstd)
        ctx.r_dtype = r.dtype
        ctx.set_materialize_grads(False)  # an unused s arrives as None, not as a tensor of zeros
        return s, h

    @staticmethod
    def backward(ctx, ds, dh):
        s, w, rstd = ctx.saved_tensors
        if dh is None:  # h unused: s's gradient passes through to x and r
            return ds, None if ds is None else ds.to(ctx.r_dtype), None, None
        g, dw = add_rms_norm_bwd(ds, dh, s, w, rstd)
        return g, g.to(ctx.r_dtype), dw, None


def add_rms_norm(
    x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float = 1e-5
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + r, rms_norm(x + r) * w), differentiable in x, r and w."""
    return AddRMSNormFunction.apply(x, r, w, eps)
