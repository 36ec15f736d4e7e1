"""Chapter 9's views on synthetic rows: the single-GPU step the all-reduce floor is set against is the
median over stored runs, not one run's, and the closing paragraph says what is measured and what is not."""

from __future__ import annotations

import pytest

from ftlib.views import ddp


def _step(label: str, ms: float, run: str, device: str = "h200") -> dict:
    return {"device_slug": device, "label": label, "mode": "eager", "precision": "fp32", "optimizer_kind": "default",
            "median_ms": ms, "run_id": run}


def _ddp(label: str, n: int, tok_s: float) -> dict:
    return {"status": "ok", "device_slug": "h200", "label": label, "config_hash": "c", "precision": "fp32",
            "mode": "eager", "B_per_rank": 32, "T": 256, "world_size": n, "tokens_per_s": tok_s, "median_ms": 10.0}


def test_the_floor_is_set_against_the_median_of_the_stored_runs():
    # The newest run (r3) is the slowest: a view that took one run would give 20 ms.
    steps = [_step("gpt2", 10.0, "r1"), _step("gpt2", 12.0, "r2"), _step("gpt2", 20.0, "r3"),
             _step("gpt2", 1.0, "r9", device="t4")]
    (g, f) = ddp.floor_vs_step.rows(steps)
    assert g["H200 1-GPU eager step ms (median of stored runs)"] == 12.0 and g["runs"] == 3
    assert g["floor, share of the step"] == pytest.approx(g["8-GPU all-reduce floor ms"] / 12.0)
    assert f["runs"] == 0 and f["floor, share of the step"] is None


def test_findings_say_what_is_measured():
    steps = [_step("gpt2", 12.0, "r1"), _step("fasttransformer", 11.0, "r1")]
    text = ddp.findings(steps, [])
    assert "fewer bytes per step" in text and "GPT-2 0." in text and "No multi-GPU step is stored" in text
    measured = ddp.findings(steps, [_ddp("gpt2", 1, 100.0), _ddp("gpt2", 8, 600.0)])
    assert "Measured weak-scaling efficiency at 8 GPUs: GPT-2 fp32 75%." in measured
    assert "No multi-GPU step" not in measured


def test_the_all_reduce_figure_names_the_models_as_the_book_does():
    assert [tr.name for tr in ddp.allreduce_figure().data] == ["GPT-2", "FastTransformer"]


def test_the_floor_is_also_set_against_the_fastest_step_stored():
    """The eager fp32 step leaves the most time to hide an all-reduce behind; the fastest step stored (any
    configuration and precision, each one's median over its runs) leaves the least, and the closing says both."""
    fast = [{**_step("gpt2", ms, run), "mode": "compile-ro", "optimizer_kind": "fused", "precision": "bf16"}
            for ms, run in ((1.0, "r1"), (1.2, "r2"), (9.0, "r3"))]
    steps = [_step("gpt2", 12.0, "r1"), _step("fasttransformer", 11.0, "r1"), *fast]
    (g, f) = ddp.floor_vs_step.rows(steps)
    assert g["its ms"] == 1.2
    assert g["fastest 1-GPU step stored"] == "compile reduce-overhead, fused AdamW outside in bf16"
    assert g["floor, share of the fastest step"] == pytest.approx(g["8-GPU all-reduce floor ms"] / 1.2)
    assert f["fastest 1-GPU step stored"] == "eager, foreach AdamW in fp32"  # its only configuration
    assert "and of the fastest single-GPU step stored (GPT-2 " in ddp.findings(steps, [])
