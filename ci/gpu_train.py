"""Convergence suites for the GPU runner (chapter 08), resumable and time-bounded.

    python ci/gpu_train.py --suites convergence-original,convergence --budget-s 500 [--smoke]

Each suite (ftlib.harness.studies.suites) stores rows under data/results/<gpu>/<bench>.jsonl and
skips what is already there, so a later call continues where a bounded one stopped.
"""

from __future__ import annotations

import argparse

from ftlib.core.device import pick_device
from ftlib.harness.convergence import describe_row, run_suites
from ftlib.harness.studies import SUITE_ORDER


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suites", default=",".join(SUITE_ORDER))
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    rows = run_suites(args.suites.split(","), pick_device(args.device), smoke=args.smoke, budget_s=args.budget_s)
    for r in rows:
        print(describe_row(r), flush=True)


if __name__ == "__main__":
    main()
