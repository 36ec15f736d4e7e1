"""Shared check-then-time loop for the kernels/dev drivers (after llm.c's dev/cuda/*.cu mains).

Each driver builds inputs, runs every variant once and checks it against the reference
(max abs / relative error against a tolerance), then - unless ``--check-only`` - times it
with ``triton.testing.do_bench`` (median ms) and prints achieved GB/s or TFLOP/s from the
bytes or FLOPs the op must move or do. ``--check-only`` on a machine without CUDA switches
on the Triton interpreter; that has to happen before triton is imported, hence
:func:`setup` runs before the drivers import anything from ``kernels``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Variant:
    name: str
    fn: Callable[[], object]  # runs the op (forward, or forward + backward) and returns what is checked
    tol: float  # max relative error (max |got - want| / max |want|) against the reference
    gpu_only: bool = False  # torch.compile / SDPA / fused optimizers: skipped in interpreter checks
    bench: Callable[[], object] | None = None  # what is timed, when not fn (fn's extra work left out)


def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--check-only", action="store_true", help="check variants against the reference; no timing")
    ap.add_argument("--variants", default="", help="comma-separated variant names (default: all)")
    return ap.parse_args(argv)


def setup(args: argparse.Namespace) -> torch.device:
    """Pick the device; without CUDA, --check-only runs the Triton kernels in the interpreter."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if not args.check_only:
        sys.exit("no CUDA device: timing needs a GPU (use --check-only for an interpreter check)")
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("triton was imported before TRITON_INTERPRET=1 could be set")
    os.environ["TRITON_INTERPRET"] = "1"
    return torch.device("cpu")


def _flatten(out: object) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flatten(o)]  # type: ignore[union-attr]


def rel_err(got: object, want: object) -> float:
    errs = []
    for a, b in zip(_flatten(got), _flatten(want)):
        b64 = b.detach().double()
        errs.append(((a.detach().double() - b64).abs().max() / b64.abs().max().clamp_min(1e-30)).item())
    return max(errs)


def run(
    title: str,
    args: argparse.Namespace,
    device: torch.device,
    reference: Callable[[], object],
    variants: list[Variant],
    work: float,
    unit: str,
) -> bool:
    """Check every variant, then time it; ``work`` is bytes (unit 'GB/s') or FLOPs ('TFLOP/s').

    Returns True when every checked variant is within its tolerance.
    """
    chosen = {v for v in args.variants.split(",") if v}
    want = reference()
    ok = True
    print(f"== {title} on {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU (Triton interpreter)'}")
    for v in variants:
        if chosen and v.name not in chosen:
            continue
        if v.gpu_only and device.type != "cuda":
            print(f"{v.name:>24}: skipped (GPU only)")
            continue
        err = rel_err(v.fn(), want)
        passed = err <= v.tol
        ok &= passed
        line = f"{v.name:>24}: max rel err {err:.2e} (tol {v.tol:.0e}) {'OK' if passed else 'FAIL'}"
        if not args.check_only and passed:
            import triton.testing

            ms = triton.testing.do_bench(v.bench or v.fn, warmup=25, rep=100, return_mode="median")
            scale = 1e-9 if unit == "GB/s" else 1e-12
            line += f" | {ms * 1e3:9.1f} us | {work * scale / (ms * 1e-3):8.1f} {unit}"
        print(line)
    return ok
