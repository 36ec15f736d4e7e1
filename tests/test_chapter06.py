"""Chapter 6 runs end to end on synthetic rows (every table, figure and verdict path) and on none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from synthetic_results import write_all

from ftlib.engineview import NOT_MEASURED

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
    assert "h200: FastTransformer engine >= 1.5x compile-ro, fp32 [engine]: needed 1.5x, measured 1.67x -> met" in out
    assert "FastTransformer engine >= 1.5x compile-ro, tf32 [engine]: needed 1.5x, measured 1.30x -> not met" in out
    assert "GPT-2 engine faster than compiled GPT-2, tf32 [+flash-attn]: needed 1x, measured 1.14x -> met" in out
    assert "Not profiled yet" not in out
    assert "fastest in a graph is v3 triton" in out
    assert out.count("<Figure:") == 4  # kernels, Figure 1 extended, engine rounds, loss agreement


def test_chapter_without_rows(tmp_path):
    out = _run(tmp_path / "empty")
    assert out.count(NOT_MEASURED) == 4 and "Ceilings not measured yet" in out and "<Figure:" not in out
    assert "Step rows not measured yet" in out and "Not profiled yet" in out
