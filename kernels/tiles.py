"""Tile sizes for the attention kernels, chosen from the device's shared memory per block.

A kernel's tiles decide how much shared memory one program needs: the operand tiles a
``tl.dot`` is staged through, times the pipeline stages on sm_80+ (and the wgmma operands on
sm_90). A block that needs more than the device's opt-in limit cannot load. A T4 (sm_75)
allows 64 KB; the fp32 dK/dV kernel at head size 64 and 64 x 64 tiles needs 80 KB there
(Triton 3.9, ``benchmarks/benchmarks/kernels/aot.py``). So each kernel takes the first of
``TILE_CANDIDATES`` whose estimate (:func:`smem_estimate`) fits the device's limits
(:mod:`kernels.limits`: the live GPU's, or a rehearsed capability's), and a GPU launch whose
compiled kernel still does not load (Triton's ``OutOfResources``, raised before anything runs)
moves on to the next (:func:`launch_tiled`); nothing fitting is a :class:`SharedMemoryError`
that names the kernel, its need and the limit.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from triton.runtime.errors import OutOfResources

from kernels.limits import Limits, device_limits

ATTN_KERNELS = ("fwd", "bwd_dq", "bwd_dkdv")


@dataclass(frozen=True)
class Tiles:
    """One attention kernel's tile sizes and launch options (BLOCK_M query rows, BLOCK_N keys)."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 16 and v & (v - 1) == 0):
                raise ValueError(f"{name}={v!r} must be a power of two >= 16 (tl.dot's smallest tile)")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise ValueError(f"num_warps={self.num_warps} must be a power of two <= 16 and num_stages="
                             f"{self.num_stages} >= 1")

    @property
    def name(self) -> str:
        """'<BLOCK_M>x<BLOCK_N> w<warps> s<stages>', what :func:`parse_tiles` reads."""
        return f"{self.block_m}x{self.block_n} w{self.num_warps} s{self.num_stages}"


_TILE_TEXT = re.compile(r"^\s*(\d+)x(\d+)\s+w(\d+)\s+s(\d+)\s*$")


def parse_tiles(text: str) -> dict[str, Tiles]:
    """'fwd 128x64 w4 s2; bwd 64x64 w8 s2' -> {'fwd': Tiles(...), 'bwd': Tiles(...)}: tiles per pass of the
    attention (the backward's two kernels share theirs), either pass optional. A ValueError says what
    is wrong."""
    out: dict[str, Tiles] = {}
    for part in (p.strip() for p in text.split(";")):
        name, _, rest = part.partition(" ")
        m = _TILE_TEXT.match(rest)
        if name not in ("fwd", "bwd") or name in out or not m:
            raise ValueError(f"attention tiles {text!r}: each part must read '<fwd|bwd> <M>x<N> w<warps> s<stages>' "
                             f"(each pass once), e.g. 'fwd 128x64 w4 s2; bwd 64x64 w8 s2'; got {part!r}")
        out[name] = Tiles(*(int(g) for g in m.groups()))
    return out


class SharedMemoryError(ValueError):
    """An attention kernel's tiles need more shared memory per block than the device has."""

    def __init__(self, kernel: str, needed: int, limit: int, detail: str) -> None:
        self.kernel, self.needed, self.limit = kernel, needed, limit
        super().__init__(f"attention kernel {kernel!r} needs {needed} bytes ({needed / 1024:.1f} KB) of shared "
                         f"memory per block, the device allows {limit} ({limit / 1024:.0f} KB): {detail}")


# In order of preference: 64 x 64 with two stages (the kernels' default, behind every H200 row),
# then smaller key tiles, then smaller query tiles. Each kernel takes the first that fits the
# device (:func:`choose_tiles`); a GPU launch that still runs out of shared memory falls back
# to the next (:func:`launch_tiled`).
TILE_CANDIDATES = (Tiles(64, 64), Tiles(64, 32), Tiles(32, 64), Tiles(32, 32), Tiles(32, 16), Tiles(16, 16))

# Shared memory per block (bytes) <= elem * HS * (a BLOCK_M + b BLOCK_N) + 4 c BLOCK_M BLOCK_N,
# elem the storage size (4 for fp32, 2 for fp16/bf16), per kernel, storage size and code path:
# below sm_80 nothing is pipelined (no asynchronous copies; Triton has no MMA there either),
# sm_80-89 stage the loop's loads for mma.sync, sm_90 feeds wgmma from shared memory. The
# smallest coefficients that bound every Triton 3.9 compilation of
# benchmarks/kernels/attention_smem_sweep.py (head sizes 32-128, tiles 32-64, 1-2 stages, ieee and
# tf32 dots); tests/test_aot.py checks that they still bound what the installed Triton compiles.
_SMEM_COEF: dict[tuple[str, int, int], tuple[float, float, float]] = {
    ("fwd", 4, 75): (1.25, 1.0, 1.0), ("fwd", 4, 80): (1.0, 2.25, 1.0), ("fwd", 4, 90): (1.0, 3.75, 0.5),
    ("fwd", 2, 75): (2.5, 1.5, 0.5), ("fwd", 2, 80): (1.0, 1.5, 0.0), ("fwd", 2, 90): (0.5, 2.0, 0.0),
    ("bwd_dq", 4, 75): (2.25, 1.75, 0.5), ("bwd_dq", 4, 80): (2.0, 2.0, 1.0), ("bwd_dq", 4, 90): (3.75, 2.25, 0.0),
    ("bwd_dq", 2, 75): (4.5, 1.5, 0.5), ("bwd_dq", 2, 80): (2.0, 2.0, 0.0), ("bwd_dq", 2, 90): (2.0, 2.0, 0.0),
    ("bwd_dkdv", 4, 75): (2.0, 2.0, 1.0), ("bwd_dkdv", 4, 80): (3.0, 2.25, 0.5),
    ("bwd_dkdv", 4, 90): (2.0, 4.0, 0.25), ("bwd_dkdv", 2, 75): (1.5, 4.5, 0.5),
    ("bwd_dkdv", 2, 80): (3.25, 2.0, 0.0), ("bwd_dkdv", 2, 90): (4.25, 1.0, 0.0),
}


def smem_estimate(kernel: str, head_size: int, dtype: torch.dtype, tiles: Tiles, sm: int = 75) -> int:
    """Upper bound on the shared memory per block ``kernel`` ('fwd', 'bwd_dq', 'bwd_dkdv') needs
    at these tiles, head size and storage dtype when compiled for sm_``sm`` (``_SMEM_COEF``).
    Past two stages each extra stage is counted as one more copy of the two-stage need."""
    if kernel not in ATTN_KERNELS:
        raise ValueError(f"unknown attention kernel {kernel!r}; expected one of {ATTN_KERNELS}")
    elem = 4 if dtype in (torch.float32, torch.float64) else 2
    path = 75 if sm < 80 else 80 if sm < 90 else 90
    a, b, c = _SMEM_COEF[(kernel, elem, path)]
    two = elem * head_size * (a * tiles.block_m + b * tiles.block_n) + 4 * c * tiles.block_m * tiles.block_n
    return int(two * max(1, tiles.num_stages - 1))


def candidate_tiles(T: int) -> tuple[Tiles, ...]:
    """``TILE_CANDIDATES`` with blocks capped at T's power of two (at least 16): short sequences
    get small tiles, so that no tile is mostly padding."""
    cap = max(16, 1 << max(0, T - 1).bit_length())
    out: list[Tiles] = []
    for t in TILE_CANDIDATES:
        c = Tiles(min(t.block_m, cap), min(t.block_n, cap), t.num_warps, t.num_stages)
        if c not in out:
            out.append(c)
    return tuple(out)


def tile_order(kernel: str, head_size: int, dtype: torch.dtype, T: int, limits: Limits | None) -> list[Tiles]:
    """:func:`candidate_tiles` in the order a launch tries them under ``limits``: those whose
    estimate fits its shared memory first, then the rest (on a GPU the compiled kernel decides).
    No limit (the CPU, None, or an unknown size): the preference order."""
    cands = list(candidate_tiles(T))
    if limits is None or limits.smem_per_block is None:
        return cands
    fit = [t for t in cands if smem_estimate(kernel, head_size, dtype, t, limits.sm) <= limits.smem_per_block]
    return fit + [t for t in cands if t not in fit]


def choose_tiles(kernel: str, head_size: int, dtype: torch.dtype, T: int, limits: Limits | None) -> Tiles:
    """The tiles ``kernel`` gets under ``limits`` (None: no limit): the first candidate whose
    :func:`smem_estimate` fits its shared memory per block, or a :class:`SharedMemoryError`
    naming the kernel, the smallest need and the device's limit."""
    order = tile_order(kernel, head_size, dtype, T, limits)
    if limits is None or limits.smem_per_block is None:
        return order[0]
    limit = limits.smem_per_block
    if smem_estimate(kernel, head_size, dtype, order[0], limits.sm) <= limit:
        return order[0]
    need = min(smem_estimate(kernel, head_size, dtype, t, limits.sm) for t in order)
    raise SharedMemoryError(kernel, need, limit, f"no tiles fit at head size {head_size} in {dtype} on "
                            f"{limits.label()}; keep attention on PyTorch's SDPA there")


# (family, kernel, device, head size, dtype, T's tile cap, limits) -> the tiles that loaded.
_CHOSEN: dict[tuple, Tiles] = {}


def tiles_to_try(kernel: str, head_size: int, dtype: torch.dtype, T: int, device: torch.device,
                explicit: Tiles | None, family: str = "flash") -> tuple[tuple | None, list[Tiles]]:
    """(cache key, tiles to try in order): the explicit tiles alone; else the cached choice; else
    :func:`tile_order` for the device. ``family``: whose kernels these are ('flash', or 'explicit' for
    ``kernels.explicit_attention``'s, estimated as the flash kernel of the same role), kept apart in the cache."""
    if explicit is not None:
        return None, [explicit]
    limits = device_limits(device)
    key = (family, kernel, str(device), head_size, dtype, candidate_tiles(T)[0], limits)
    if key in _CHOSEN:
        return key, [_CHOSEN[key]]
    return key, tile_order(kernel, head_size, dtype, T, limits)


def launch_tiled(kernel: str, launch: Callable[[Tiles], Any], order: list[Tiles], key: tuple | None) -> Any:
    """Run ``launch(tiles)`` with the first tiles whose kernel loads; Triton raises
    OutOfResources when a compiled kernel needs more shared memory than the device's opt-in
    limit, before anything runs. The winner is cached, so later calls (and a CUDA-graph
    capture after the warm-up) launch once."""
    err = None
    for tiles in order:
        try:
            out = launch(tiles)
        except OutOfResources as e:
            if e.name != "shared memory":
                raise
            err = e
            continue
        if key is not None:
            _CHOSEN[key] = tiles
        return out
    tried = ", ".join(f"{t.block_m}x{t.block_n}/s{t.num_stages}" for t in order)
    raise SharedMemoryError(kernel, int(err.required), int(err.limit),
                            f"no tiles fit (tried {tried}); keep attention on PyTorch's SDPA on this device") from err
