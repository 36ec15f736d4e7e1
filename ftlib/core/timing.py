"""Timing on the device: one way to time a call, one summary of the times.

On a GPU a call is timed with CUDA events recorded around it (the device's own clock; the
host may run ahead, so a launch-bound call shows its gaps); on the CPU with ``perf_counter``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(
    call: Callable[[int], Any], n: int, device: torch.device, start: int = 0,
    before: Callable[[int], None] | None = None,
) -> tuple[list[float], Any]:
    """Milliseconds of ``call(start)`` ... ``call(start + n - 1)`` one by one, and the last result.

    ``before(k)`` runs untimed before each call (copying the next batch into static buffers).
    On a GPU the events of every call are recorded back to back and read after one
    synchronization at the end, so the timing does not stall the queue between calls.
    """
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        out = None
        for i in range(n):
            if before is not None:
                before(start + i)
            starts[i].record()
            out = call(start + i)
            ends[i].record()
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) for s, e in zip(starts, ends)], out
    times, out = [], None
    for i in range(n):
        if before is not None:
            before(start + i)
        t0 = time.perf_counter()
        out = call(start + i)
        times.append((time.perf_counter() - t0) * 1e3)
    return times, out


def time_once(fn: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds of one call of ``fn``, synchronized at its end."""
    return time_calls(lambda _: fn(), 1, device)[0][0]


def percentile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), for q in [0, 1]."""
    pos = (len(sorted_xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summarize_ms(times_ms: Sequence[float]) -> dict[str, float]:
    """Median, p20, p80, min, max and mean of per-call times in milliseconds."""
    xs = sorted(times_ms)
    return {
        "median_ms": percentile(xs, 0.5), "p20_ms": percentile(xs, 0.2), "p80_ms": percentile(xs, 0.8),
        "min_ms": xs[0], "max_ms": xs[-1], "mean_ms": sum(xs) / len(xs),
    }
