"""Chapter 9's views on synthetic rows: the single-GPU step the all-reduce floor is set against is the
median over stored runs, not one run's, and the closing paragraph says what is measured and what is not."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
from synthetic_results import BASELINE_CASES, baselines_run

from ftlib.views import baselines as bv
from ftlib.views import ddp

# Two precisions of the baselines suite: the eager fp32 step, and a faster configuration in bf16.
CASES = [dataclasses.replace(c, precision=p) for c in BASELINE_CASES for p in ("fp32", "bf16")]


def _run(run: str, ms: dict[tuple[str, str, str, str], float], device: str = "h200", **kw) -> list[dict]:
    """One complete run of :data:`CASES` on ``device``; ``ms[(label, mode, optimizer, precision)]`` or 50 ms."""
    rows = baselines_run(run, f"m-{run}", {}, cases=CASES, **kw)
    for r in rows:
        r["median_ms"] = ms.get((r["label"], r["mode"], r["optimizer_kind"], r["precision"]), 50.0)
        r["device_slug"] = device
    return rows


def _runs(*rows: list[dict]) -> pd.DataFrame:
    return bv.load(CASES, rows=[r for run in rows for r in run])


def _ddp(label: str, n: int, tok_s: float) -> dict:
    return {"status": "ok", "device_slug": "h200", "label": label, "config_hash": "c", "precision": "fp32",
            "mode": "eager", "B_per_rank": 32, "T": 256, "world_size": n, "tokens_per_s": tok_s, "median_ms": 10.0}


def test_the_floor_is_set_against_the_median_of_the_stored_runs():
    # The newest run (r3) is the slowest: a view that took one run would give 20 ms. A run from a dirty tree
    # (r4) and another GPU's run (r9) are not read.
    eager = ("gpt2", "eager", "default", "fp32")
    runs = _runs(_run("r1", {eager: 10.0}), _run("r2", {eager: 12.0}), _run("r3", {eager: 20.0}),
                 _run("r4", {eager: 1.0}, commit="0123456789ab+dirty"), _run("r9", {eager: 1.0}, device="t4"))
    (g, f) = ddp.floor_vs_step.rows(runs)
    assert g["H200 1-GPU eager step ms (median of stored runs)"] == 12.0 and g["runs"] == 3
    assert g["floor, share of the step"] == pytest.approx(g["8-GPU all-reduce floor ms"] / 12.0)
    assert f["H200 1-GPU eager step ms (median of stored runs)"] == 50.0 and f["runs"] == 3
    (g, f) = ddp.floor_vs_step.rows(_runs())
    assert g["runs"] == 0 and g["floor, share of the step"] is None and g["its ms"] is None


def test_findings_say_what_is_measured():
    runs = _runs(_run("r1", {("gpt2", "eager", "default", "fp32"): 12.0}))
    text = ddp.findings(runs, [])
    assert "fewer bytes per step" in text and "GPT-2 0." in text and "No multi-GPU step is stored" in text
    measured = ddp.findings(runs, [_ddp("gpt2", 1, 100.0), _ddp("gpt2", 8, 600.0)])
    assert "Measured weak-scaling efficiency at 8 GPUs: GPT-2 fp32 75%." in measured
    assert "No multi-GPU step" not in measured


def test_the_all_reduce_figure_names_the_models_as_the_book_does():
    assert [tr.name for tr in ddp.allreduce_figure().data] == ["GPT-2", "FastTransformer"]


def test_the_floor_is_also_set_against_the_fastest_step_stored():
    """The eager fp32 step leaves the most time to hide an all-reduce behind; the fastest step stored (any
    configuration and precision, each one's median over its runs) leaves the least, and the closing says both."""
    fast, ft = ("gpt2", "compile-ro", "fused", "bf16"), ("fasttransformer", "engine", "default", "bf16")
    runs = _runs(_run("r1", {fast: 1.0, ft: 5.0}), _run("r2", {fast: 1.2, ft: 5.0}), _run("r3", {fast: 9.0}))
    (g, f) = ddp.floor_vs_step.rows(runs)
    assert g["its ms"] == 1.2
    assert g["fastest 1-GPU step stored"] == "compile reduce-overhead, fused AdamW outside in bf16"
    assert g["floor, share of the fastest step"] == pytest.approx(g["8-GPU all-reduce floor ms"] / 1.2)
    assert (f["its ms"], f["fastest 1-GPU step stored"]) == (5.0, "the engine in bf16")
    assert "and of the fastest single-GPU step stored (GPT-2 " in ddp.findings(runs, [])


def test_an_earlier_engine_is_its_own_configuration_named_so():
    """Engine rows of another engine than today's stand apart from the current engine's, and are named so."""
    fast = ("gpt2", "engine", "default", "bf16")
    old = _run("r1", {fast: 1.0})
    for r in old:
        if r["mode"] == "engine":
            r["engine"] = {**r["engine"], "grad_into_buffer": False}
    (g, _) = ddp.floor_vs_step.rows(_runs(old, _run("r2", {fast: 3.0})))
    assert (g["its ms"], g["fastest 1-GPU step stored"]) == (1.0, "an earlier engine in bf16")
