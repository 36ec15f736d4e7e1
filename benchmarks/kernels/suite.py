"""The kernels suite: the measured ceilings, then every driver, rows into kernels.jsonl.

    python -m benchmarks.kernels.suite [--ops ceilings,rmsnorm] [--budget-s 500] [--device cuda]

Run from the repository root. The GPU runner's ``kernels`` suite (``ci/gpu-run --only kernels``)
and chapter 6's measuring path run this program; nothing in ftlib imports it. Resumable:
rows whose keys are stored are skipped (a variant is re-measured only if one of its rows is
missing or an error); no new variant starts after the deadline. Ceilings run first, because
every kernel row is read against them. Without CUDA everything runs at tiny sizes in the
Triton interpreter (set up here, before triton is imported) and the rows land in
``data/results/cpu/`` (not committed).
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable, Sequence

import torch

from benchmarks.kernels._harness import BENCH, Recorder, use_interpreter

DRIVERS = ("ceilings", "rmsnorm", "layernorm", "cross_entropy", "adamw", "attention", "residual_norm", "bias_grad",
           "causal_softmax", "kv_split_sum")


def run_suite(
    device: torch.device | str | None = None,
    store=None,
    deadline: float | None = None,
    ops: Sequence[str] | None = None,
    on_row: Callable[[dict], None] | None = None,
    cpu_reps: int = 3,
) -> list[dict]:
    """Run ``ops`` (default: all, ceilings first); return the rows measured now.

    ``store`` defaults to ``ResultStore('kernels', device_slug(device))``; ``deadline`` is a
    ``time.monotonic()`` value. A driver that fails outright is reported and the next one runs.
    """
    from ftlib.core.device import device_slug, pick_device
    from ftlib.harness.results import ResultStore

    dev = pick_device(device or "auto") if not isinstance(device, torch.device) else device
    if dev.type != "cuda":
        use_interpreter()
    if store is None:
        store = ResultStore(BENCH, device_slug(dev))
    names = list(ops or DRIVERS)
    unknown = [n for n in names if n not in DRIVERS]
    if unknown:
        raise ValueError(f"unknown kernel suite driver(s) {unknown}; known: {list(DRIVERS)}")
    rec = Recorder(store=store, deadline=deadline, on_row=on_row)
    for name in names:
        if rec.out_of_time():
            print(f"[kernels] budget spent before {name}", flush=True)
            break
        module = "benchmarks.kernels.ceilings" if name == "ceilings" else f"benchmarks.kernels.{name}_dev"
        try:
            importlib.import_module(module).main(["--reps", str(cpu_reps)], rec)
        except Exception as e:  # one broken driver must not lose the others' rows
            print(f"[kernels] {name} failed: {type(e).__name__}: {e}", flush=True)
    return rec.rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default=",".join(DRIVERS), help="comma-separated, from " + ",".join(DRIVERS))
    ap.add_argument("--budget-s", type=float, default=None, help="no new variant after this many seconds")
    ap.add_argument("--device", default="auto", help="auto, cuda, cuda:N or cpu (the Triton interpreter)")
    ap.add_argument("--cpu-reps", type=int, default=3, help="timed calls per variant on the CPU")
    args = ap.parse_args(argv)
    deadline = None if args.budget_s is None else time.monotonic() + args.budget_s
    rows = run_suite(args.device, ops=[o for o in args.ops.split(",") if o], deadline=deadline,
                     cpu_reps=args.cpu_reps)
    print(f"[kernels] {len(rows)} rows measured now")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
