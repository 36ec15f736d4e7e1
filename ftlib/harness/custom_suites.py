"""The GPU runner's suites that are not lists of step-benchmark cases: the profiles (chapter 1), the
training studies (chapter 8), the engine checks and the kernel benchmarks (chapter 6).

Each is ``runner(device, deadline)`` (``deadline`` a ``time.monotonic()`` value: no new work starts
after it) and writes its rows into the results files named in :data:`FILES`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

import torch

from ftlib.core.repo import repo_root
from ftlib.harness.studies import SUITE_ORDER
from ftlib.harness.suites import SUITES


def _profile(device: torch.device, deadline: float) -> None:
    """Chapter 1: measured profiles, both presets, B=32 T=256; cheap modes first.

    First the FastTransformer as the original passes K/V, (B, 1, T, d) (kv_layout='broadcast'),
    eager fp32 and tf32: chapters 4 and 7 read from its trace which SDPA backend that layout gets.
    """
    from ftlib.harness.profiling import profile_suite

    for r in profile_suite(["fasttransformer"], ["eager"], ["fp32", "tf32"], 32, 256, device, kv_layout="broadcast"):
        print(f"  profile fasttransformer kv=broadcast {r.get('mode'):<10} {r.get('precision'):<5} {r.get('status')} "
              f"step {r.get('step_ms')} ms sdpa {r.get('sdpa_backend')} {str(r.get('error', ''))[:120]}", flush=True)
    for modes, precs in ((["eager", "cudagraph"], ["fp32", "tf32"]), (["compile-ro"], ["fp32"]),
                         (["eager", "cudagraph"], ["bf16"])):
        for name in ("gpt2", "fasttransformer"):
            if time.monotonic() > deadline - 60:
                print("[profile] budget spent", flush=True)
                return
            for r in profile_suite([name], modes, precs, 32, 256, device):
                print(f"  profile {name:<16} {r.get('mode'):<10} {r.get('precision'):<5} {r.get('status')} "
                      f"step {r.get('step_ms')} ms sdpa {r.get('sdpa_backend')} {str(r.get('error', ''))[:120]}",
                      flush=True)


def _train(device: torch.device, deadline: float) -> None:
    """Chapter 8: convergence suites (ftlib.harness.convergence), resumable."""
    from ftlib.harness.convergence import describe_row, run_suites

    for r in run_suites(SUITE_ORDER, device, budget_s=max(1.0, deadline - time.monotonic())):
        print(f"  train {describe_row(r)}", flush=True)  # failed runs too (stored with status 'error')


def _engine_check(device: torch.device, deadline: float) -> None:
    """The engine vs reference training over 100 steps (ftlib.harness.engine_check)."""
    from ftlib.harness.engine_check import run_engine_checks

    run_engine_checks(device, deadline, log=lambda line: print(line, flush=True))


def _kernels(device: torch.device, deadline: float) -> None:
    """The measured ceilings (1 GiB copy, 8192^2 matmuls) and every kernel driver, each variant timed
    eagerly and inside a CUDA graph; rows in kernels.jsonl, resumable. A program of its own
    (``python -m benchmarks.kernels.suite``): ftlib does not import the benchmarks.
    """
    # A torch.compile variant compiles for ~30 s before its timing starts: stop starting them earlier.
    budget = max(1.0, deadline - 45 - time.monotonic())
    rc = subprocess.run([sys.executable, "-m", "benchmarks.kernels.suite", "--device", str(device),
                         "--budget-s", f"{budget:.0f}"], cwd=str(repo_root()), timeout=budget + 120).returncode
    print(f"[kernels] suite exited with {rc}", flush=True)


# Suites that are not lists of step-benchmark cases: name -> runner(device, deadline), and their files.
CUSTOM: dict[str, Callable[[torch.device, float], None]] = {
    "profile": _profile, "train": _train, "engine_check": _engine_check, "kernels": _kernels}
FILES = {"profile": ["profile"], "train": list(SUITE_ORDER),
         "engine_check": ["engine_check"], "kernels": ["kernels"]}
# Suites that produce no result the book's headlines read; they may run from uncommitted code.
EXPLORATORY = ("kernels", "compile_max")


def known_suites() -> list[str]:
    """Every suite the runner knows: the case lists of ``ftlib.harness.suites``, then these."""
    return [*SUITES, *CUSTOM]


def parse_suites(only: str | None) -> list[str]:
    """The suites named in ``--only`` (the default ones when None); unknown names are an error."""
    if only is None:
        return [n for n, s in SUITES.items() if s.default]
    names = [s.strip() for s in only.split(",") if s.strip() and s.strip() != "none"]
    unknown = [n for n in names if n not in SUITES and n not in CUSTOM]
    if unknown:
        raise ValueError(f"unknown suite(s) {', '.join(unknown)}; known suites: {', '.join(known_suites())}")
    if not names:
        raise ValueError(f"--only names no suite; known suites: {', '.join(known_suites())}")
    return names


