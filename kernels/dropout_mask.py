"""Inverted-dropout keep masks drawn from Philox by element index, for the fused kernels.

The mask of :mod:`kernels.residual_norm`'s residual dropout (its module docstring has the
semantics): ``keep = uniform(seed * SALTS + salt, counter) >= p`` with Philox (Salmon et al.
2011; ``tl.rand`` / ``tl.randint4x``), the counter a function of the element's (row, column)
only, so a backward kernel on any tiling or grid redraws the forward's mask. ``keep_mask``
materializes it for tests and references.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._common import check_tensor, same_device

# Call sites per step that the salt may separate (seed * SALTS + salt keys each stream).
SALTS = 1024
# The mask's random numbers: one Philox call per 4 columns (v2, True) or per element (v1, False).
# Philox returns four 32-bit numbers per call, so v2 draws a quarter of the calls; it is the faster of
# the two alone (8192 x 256, fwd+bwd in a graph) and in the speedrun step, where v1 also loses to
# nn.Dropout (kernels.jsonl and engine_probe.jsonl; chapter 6 and the lab notes show the numbers).
RNG4 = True


@triton.jit
def _keep(SEED, salt, rows, N, p, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, RNG4: tl.constexpr):
    """Keep mask (ROWS, BLOCK_N) of inverted dropout for the tile of ``rows``: uniform >= p.

    RNG4 (v2): one Philox4x32 call per 4 columns, counter row * cdiv(N, 4) + col // 4, its lane
    col % 4 for the column: a quarter of the Philox work of v1. v1: one call per element,
    counter row * N + col, lane 0 only (``tl.rand``: Philox computes four lanes and keeps one).
    Key: seed * SALTS + salt (SALTS = 1024)."""
    seed = tl.load(SEED) * 1024 + salt
    if RNG4:
        q = tl.arange(0, BLOCK_N // 4)
        cnt = (rows[:, None] * ((N + 3) // 4) + q[None, :]).to(tl.int32)  # (ROWS, BLOCK_N / 4)
        r0, r1, r2, r3 = tl.randint4x(seed, cnt)
        # join + reshape puts lane l at column 4q + l: (ROWS, BQ, 2, 2)[..., k, m] -> column 4q + 2k + m.
        u = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), (ROWS, BLOCK_N))
        return tl.random.uint_to_uniform_float(u) >= p
    cols = tl.arange(0, BLOCK_N)
    return tl.rand(seed, (rows[:, None] * N + cols[None, :]).to(tl.int32)) >= p


@triton.jit
def _keep_mask_kernel(SEED, OUT, M, N, salt, p, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, RNG4: tl.constexpr):
    """out[row, col] = keep: the mask the fused kernels draw, for tests and references."""
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    keep = _keep(SEED, salt, rows, N, p, ROWS, BLOCK_N, RNG4)
    tl.store(OUT + rows[:, None] * N + cols[None, :], keep.to(tl.int8), mask=mask)


def _check_dropout(p: float, seed: torch.Tensor | None, salt: int, like: torch.Tensor) -> None:
    """p in [0, 1); with p > 0 a one-element int64 seed tensor on like's device and 0 <= salt < SALTS."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout p={p} must be in [0, 1)")
    if p == 0.0:
        return
    if seed is None:
        raise ValueError(f"dropout p={p} needs a seed tensor (one int64 on the device)")
    check_tensor("seed", seed, dtypes=(torch.int64,))
    same_device(("x", like), ("seed", seed))
    if seed.numel() != 1:
        raise ValueError(f"seed must hold one value, got shape {tuple(seed.shape)}")
    if not 0 <= salt < SALTS:
        raise ValueError(f"salt={salt} must be in [0, {SALTS})")
    if like.numel() >= 2**31:
        raise ValueError(f"{like.numel()} elements: the dropout mask is indexed in int32 (< 2**31)")


def keep_mask(
    seed: torch.Tensor, shape: tuple[int, ...] | torch.Size, p: float, salt: int = 0, rng4: bool = RNG4,
) -> torch.Tensor:
    """The keep mask (bool, ``shape``) that the fused kernels draw for ``seed``'s current value,
    ``salt`` and dropout ``p`` over rows of ``shape[-1]``: for tests, and for the rare backward
    where only s is used."""
    N = shape[-1] if len(shape) else 1
    M = math.prod(shape) // max(N, 1)
    _check_dropout(p, seed, salt, torch.empty(0, device=seed.device))
    out = torch.empty(M, N, dtype=torch.int8, device=seed.device)
    if M * N:
        _keep_mask_kernel[(M,)](seed, out, M, N, salt, p, ROWS=1, BLOCK_N=_block_n(N), RNG4=rng4)
    return out.view(shape).bool()  # (M, N) -> shape


def _block_n(N: int) -> int:
    """Columns per tile: N rounded up to a power of two, at least 4 (RNG4 draws 4 columns a call)."""
    return max(4, triton.next_power_of_2(N))
