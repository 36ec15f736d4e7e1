"""The GPU runner's command line: the book's measuring suites within a time budget.

    python3 ci/gpu_bench.py run --out OUT [--only baselines,tsweep] [--budget-s 540] [--notebooks 01,03]
    python3 ci/gpu_bench.py warm [--only baselines] [--jobs 8]   # fill the compile caches in parallel
    python3 ci/gpu_bench.py collect --out OUT [--only ...]       # copy results into OUT, print the summary
    python3 ci/gpu_bench.py list                                 # the suites and their sizes
    python3 ci/gpu_bench.py plan --capability 7.5 --json         # what would run on a T4, without a GPU

What each command does is ``ftlib.harness.gpu_runner``'s (the suites: ``ftlib.harness.suites`` and
``ftlib.harness.custom_suites``). ``ci/gpu-run`` calls it with the repository root on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import math
import sys

from ftlib.core.device import pick_device
from ftlib.harness.custom_suites import known_suites, parse_suites
from ftlib.harness.gpu_runner import (
    MIN_BUDGET_S,
    RESERVE_S,
    collect,
    list_suites,
    plan,
    run,
    warm,
    with_labels,
    with_precisions,
)
from ftlib.harness.suites import SUITES


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def _budget(text: str) -> float:
    v = float(text)
    if not math.isfinite(v) or v < MIN_BUDGET_S:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_BUDGET_S:.0f} seconds (the driver keeps "
                                         f"{RESERVE_S:.0f} s to collect results), got {text}")
    return v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("run", "warm", "collect", "list", "plan"))
    ap.add_argument("--out", default="build/gpu-out", help="folder that receives the result files (run, collect)")
    ap.add_argument("--only", default=None,
                    help=f"comma-separated suites (default: {','.join(n for n, s in SUITES.items() if s.default)}); "
                         f"known: {', '.join(known_suites())}")
    ap.add_argument("--precisions", default=None,
                    help="run, warm: only the cases in these comma-separated precisions (e.g. fp16)")
    ap.add_argument("--labels", default=None,
                    help="run: only the cases with these comma-separated labels (one case suite)")
    ap.add_argument("--budget-s", type=_budget, default=540.0, help="seconds this call may take (at least 60)")
    ap.add_argument("--notebooks", default="", help="chapters to execute with papermill, e.g. 01,03")
    ap.add_argument("--device", default="auto", help="auto, cuda, cuda:N or cpu")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps before timing (at least 2 are run)")
    ap.add_argument("--iters", type=_positive_int, default=50, help="timed steps per case")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="measure uncommitted code into build/uncommitted-results/ (nothing reads it)")
    ap.add_argument("--jobs", type=_positive_int, default=12, help="parallel compile processes (warm)")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="per-case limit for warm")
    ap.add_argument("--capability", default=None, help="plan: a GPU's compute capability (e.g. 7.5), no GPU needed")
    ap.add_argument("--json", action="store_true", help="plan: print the cases that would run as a JSON list")
    ap.add_argument("--all", action="store_true", help="plan --json: the skipped cases too, with their reason")
    args = ap.parse_args(argv)
    if args.warmup < 0:
        ap.error("--warmup must be >= 0")
    if args.command == "list":
        return list_suites(args)
    try:
        pick_device(args.device)
        names = parse_suites(args.only)
        with_precisions([], args.precisions)  # an unknown precision is an error before anything runs
        not_cases = [n for n in names if n not in SUITES]
        if args.precisions and not_cases:
            raise ValueError("--precisions applies to the case suites only (gpu_bench.py list), "
                             "not to " + ", ".join(not_cases))
        if args.labels:  # every label must name a case of the one suite asked for
            if len(names) != 1 or names[0] not in SUITES:
                raise ValueError("--labels needs --only with one case suite")
            with_labels(SUITES[names[0]].cases(), args.labels)
        if args.command == "run":
            return run(args)
        if args.command == "plan":
            return plan(args)
        return warm(args) if args.command == "warm" else collect(args)
    except ValueError as e:
        print(f"gpu_bench: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
