"""Chapter 6 runs end to end on synthetic rows (every table, figure and verdict path) and on none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from synthetic_results import write_all

from ftlib.views.engine import NOT_MEASURED

ROOT = Path(__file__).resolve().parent.parent


def _run(results: Path) -> str:
    env = {**os.environ, "FTLIB_RESULTS_DIR": str(results), "FTLIB_STATIC_PNG": "0"}
    p = subprocess.run([sys.executable, "06_kernels.py"], cwd=ROOT / "book", env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def test_chapter_with_synthetic_rows(tmp_path):
    out = _run(write_all(tmp_path / "results"))
    assert NOT_MEASURED not in out and "not measured yet" not in out.lower()
    # The engine against the strongest compiled step of each run, named, with the spread and verdict.
    assert "| H200 | FastTransformer | bf16 | the current defaults | 3.6 | compile reduce-overhead, whole step " \
        "compiled | 6 | 1.67× | faster | 3 runs, 2 machine starts |" in out
    assert "| H200 | GPT-2 | fp32 | the current defaults | 9 | compile reduce-overhead, fused AdamW outside | 8" \
        " | 0.89× | slower |" in out
    assert "Not profiled yet" not in out
    assert "fastest in a graph is v3 triton" in out
    # kernels, the configurations of the engine's runs, launches per step, the speed-of-light ledger, loss agreement
    assert out.count("<Figure:") == 5
    assert "<Figure: The engine's step by kernel class, H200" in out
    assert "| H200 | FastTransformer bf16 | bf16 | matmul | 900 | 24 |" in out  # the ledger, class by class
    # an option not yet a default, beside the default case of its run, and what it still needs
    assert ("| H200 | bf16 | FastTransformer | +grad-into-buffer | 1.74 | 1.6 | -140 | 1.09× | yes | – | yes | c1 |"
            in out)


def test_chapter_without_rows(tmp_path):
    out = _run(tmp_path / "empty")
    assert out.count(NOT_MEASURED) == 2 and "Ceilings not measured yet" in out and "<Figure:" not in out
    assert "Not profiled yet" in out and "| H200 |" not in out and "| h200 |" not in out
