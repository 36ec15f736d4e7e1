"""Convergence suites for the GPU runner (chapter 08), resumable and time-bounded.

    python ci/gpu_train.py --suites convergence-original,convergence --budget-s 500 [--smoke] [--allow-dirty]

Each suite (ftlib.harness.studies.suites) stores rows under data/results/<gpu>/<bench>.jsonl and
skips what is already there, so a later call continues where a bounded one stopped. Like
ci/gpu-run it refuses code that is not committed (the rows feed chapter 8), unless --allow-dirty
(or --smoke), which measure where no chapter reads.
"""

from __future__ import annotations

import argparse

from ftlib.core.device import pick_device
from ftlib.harness.convergence import describe_row, run_suites
from ftlib.harness.gpu_runner import check_provenance
from ftlib.harness.studies import SUITE_ORDER


def main() -> None:
    ap = argparse.ArgumentParser(description="Chapter 8's training studies on this machine, resumable.")
    ap.add_argument("--suites", default=",".join(SUITE_ORDER), help=f"comma-separated, of {', '.join(SUITE_ORDER)}")
    ap.add_argument("--budget-s", type=float, default=480.0, help="no run starts once these seconds are spent")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--smoke", action="store_true", help="tiny models (a check, not a measurement)")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="measure uncommitted code, into build/uncommitted-results/")
    args = ap.parse_args()
    unknown = sorted(set(args.suites.split(",")) - set(SUITE_ORDER))
    if unknown:
        ap.error(f"unknown suites {', '.join(unknown)}; the suites are {', '.join(SUITE_ORDER)}")
    if not args.smoke:
        try:
            check_provenance(["train"], args.allow_dirty)
        except ValueError as e:
            ap.error(str(e))
    rows = run_suites(args.suites.split(","), pick_device(args.device), smoke=args.smoke, budget_s=args.budget_s)
    for r in rows:
        print(describe_row(r), flush=True)


if __name__ == "__main__":
    main()
