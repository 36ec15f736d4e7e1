"""Chapter 4 reads stored rows through ftlib.views.codesign: the 2^4 grid, the ladder, the SDPA backend of each
K/V layout and what the original layout costs.

Synthetic rows go into a temporary results directory (FTLIB_RESULTS_DIR), never into data/results; their
numbers are chosen so every ratio and verdict is known in advance.
"""

from __future__ import annotations

import math

import pytest
from view_rows import SLUG, profile_row, step_row, write

from ftlib.analysis.claims import POST_CLAIMED
from ftlib.model.ablations import SWITCHES, grid, ladder
from ftlib.model.config import preset
from ftlib.views import codesign as codesignview

pytestmark = pytest.mark.usefixtures("results_root")  # results under tmp_path (conftest)


FACTORS = {"eager": {"MQA": 0.9, "SDPA": 0.8, "MLP2x": 0.7, "RMS": 1.1},
           "compile-ro": {"MQA": 0.95, "SDPA": 0.9, "MLP2x": 0.8, "RMS": 1.0}}


def grid_rows(mode: str, bench: str, skip: tuple[str, ...] = ()) -> list[dict]:
    """Every grid cell, its time the product of its switches' factors (so each effect is exact)."""
    out = []
    for label, cfg in grid().items():
        if label in skip:
            continue
        names = () if label == "gpt2" else label.split("+")
        out.append(step_row(bench, label, cfg, 32, 256, mode, "fp32",
                            10.0 * math.prod(FACTORS[mode][n] for n in names)))
    return out


def test_grid_table_compile_column_and_switch_effects():
    write(*grid_rows("eager", "grid"), *grid_rows("compile-ro", "grid_compile"))
    table = codesignview.grid_table.rows(codesignview.measured(SLUG))
    assert len(table) == 16 and table[0]["cell"] == "gpt2"
    assert table[0]["compile-ro fp32 ms"] == pytest.approx(10.0) and table[0]["cudagraph fp32 ms"] is None
    effects = {r["mode"]: r for r in codesignview.switch_effects.rows(table)}
    for sw in SWITCHES:
        assert effects["eager fp32"][f"{sw} speed-up"] == pytest.approx(1 / FACTORS["eager"][sw])
        assert effects["compile-ro fp32"][f"{sw} speed-up"] == pytest.approx(1 / FACTORS["compile-ro"][sw])
        assert effects["cudagraph fp32"][f"{sw} speed-up"] is None


def test_switch_effect_needs_all_eight_pairs(results_root):
    write(*grid_rows("compile-ro", "grid_compile", skip=("MQA+SDPA",)))
    table = codesignview.grid_table.rows(codesignview.measured(SLUG))
    effects = {r["mode"]: r for r in codesignview.switch_effects.rows(table)}
    # MQA+SDPA pairs with SDPA (for MQA) and with MQA (for SDPA), and is 'off' for MLP2x and RMS.
    assert all(effects["compile-ro fp32"][f"{sw} speed-up"] is None for sw in SWITCHES)


def test_ladder_takes_its_own_rows_first_and_the_last_rung_from_the_baselines():
    rungs = ladder()
    write(*[step_row("ladder", r, cfg, 32, 256, "compile-ro", "fp32", 9.0 - i) for i, (r, cfg) in
            enumerate(rungs.items())])
    write(*grid_rows("compile-ro", "grid_compile"), *grid_rows("eager", "grid"))
    # The baselines' FastTransformer differs from the last rung in its init only; its other
    # placements of AdamW are not what the grid measures.
    write(step_row("baselines", "fasttransformer", preset("fasttransformer"), 32, 256, "eager", "fp32", 4.5,
                   optimizer_kind="default"),
          step_row("baselines", "fasttransformer", preset("fasttransformer"), 32, 256, "eager", "fp32", 1.0,
                   optimizer_kind="fused", date="2026-12-04T10:00:00Z"))
    assert rungs["+no bias = fasttransformer"] != preset("fasttransformer")
    table = {r["rung"]: r for r in codesignview.ladder_table.rows(codesignview.measured(SLUG))}
    assert table["gpt2"]["compile-ro fp32 ms"] == 9.0 and table["gpt2"]["compile-ro fp32 from"] == "ladder"
    last = table["+no bias = fasttransformer"]
    assert last["eager fp32 ms"] == 4.5 and last["eager fp32 from"] == "baselines"
    assert table["+MQA"]["eager fp32 from"] == "grid" and table["+MQA"]["eager fp32 ms"] == pytest.approx(9.0)
    # the figure names the rungs as the book names the models
    fig = codesignview.ladder_figure(codesignview.ladder_table(codesignview.measured(SLUG)), SLUG)
    rung_names = list(fig.data[0].x)
    assert rung_names[0] == "GPT-2" and rung_names[-1] == "+no bias = FastTransformer"
    # The grid view prefers the grid's compiled run where both measured a cell.
    grid_view = {r["cell"]: r for r in codesignview.grid_table.rows(codesignview.measured(SLUG))}
    assert grid_view["gpt2"]["compile-ro fp32 ms"] == pytest.approx(10.0)


def test_backend_table_reads_each_variant_from_its_trace():
    write(profile_row("fasttransformer", "fp32", "mem_efficient", 17.0),
          profile_row("fasttransformer-broadcast", "fp32", "math", 20.0),
          profile_row("fasttransformer-broadcast", "fp32", "math", 1.0, mode="cudagraph"))
    lines = {(r["model"], r["precision"]): r for r in codesignview.backend_table.rows(SLUG)}
    assert lines[("fasttransformer", "fp32")]["SDPA backend (from trace)"] == "mem_efficient"
    b = lines[("fasttransformer-broadcast", "fp32")]
    assert b["SDPA backend (from trace)"] == "math" and b["step ms (profiler run)"] == 20.0
    assert b["expected (accounting)"] == "math" and "(B, 1, T, d)" in b["K/V as passed"]
    assert lines[("fasttransformer-broadcast", "tf32")]["SDPA backend (from trace)"].startswith("not measured yet")
    assert lines[("gpt2", "fp32")]["step ms (profiler run)"] is None


def layout_pair(mode: str, expanded: float, original: float | None, run: str, machine: str, **extra) -> list[dict]:
    ft, fb = codesignview.VARIANTS["fasttransformer"], codesignview.VARIANTS["fasttransformer-broadcast"]
    out = [step_row("baselines", "fasttransformer", ft, 32, 256, mode, "fp32", expanded, run_id=run,
                    machine_id=machine, **extra)]
    if original is not None:
        out.append(step_row("baselines", "fasttransformer-broadcast", fb, 32, 256, mode, "fp32", original,
                            run_id=run, machine_id=machine, **extra))
    return out


def test_fallback_cost_pairs_the_layouts_within_each_run_then_spreads_over_runs():
    ft = codesignview.VARIANTS["fasttransformer"]
    write(*layout_pair("eager", 10.0, 12.0, "a", "m0"), *layout_pair("eager", 20.0, 30.0, "b", "m1"),
          *layout_pair("eager", 10.0, 13.0, "c", "m0"),
          # a newer run that measured only one layout must not be paired with another run's row
          *layout_pair("eager", 1.0, None, "d", "m1", date="2026-12-05T10:00:00Z"),
          *layout_pair("cudagraph", 7.0, 8.4, "a", "m0"),
          step_row("grid", "n_kv_head=1", ft, 32, 256, "eager", "fp32", 3.0))  # same config, other suite
    cost = {r["mode"]: r for r in codesignview.fallback_cost.rows(codesignview.measured(SLUG))}
    e = cost["eager"]
    assert e["cost of the layout"] == pytest.approx(1.3) and e["cost of the layout, lowest run"] == pytest.approx(1.2)
    assert e["cost of the layout, highest run"] == pytest.approx(1.5)
    assert e["expanded K/V ms"] == 10.0 and e["original (B,1,T,d) ms"] == 13.0  # medians over runs a, b, c
    assert e["runs"] == "3 runs on 2 machine starts" and e["verdict"] == "the original layout is slower"
    assert cost["cudagraph"]["runs"] == "1 run on 1 machine start" and "too few runs" in cost["cudagraph"]["verdict"]
    assert cost["compile-ro"]["cost of the layout"] is None and cost["compile-ro"]["runs"] == 0


def test_grid_runs_and_run_scatter_count_runs_and_machine_starts():
    from ftlib.views import codesign_findings as findings

    write(*[dict(r, run_id="g1", machine_id="m0") for r in grid_rows("eager", "grid")],
          *[dict(r, run_id="c1", machine_id="m1") for r in grid_rows("compile-ro", "grid_compile")])
    rows = codesignview.measured(SLUG)
    runs = {r["column"]: r for r in codesignview.grid_runs.rows(rows)}
    assert runs["eager fp32"]["runs"] == 1 and runs["eager fp32"]["measured"] == "16 of 16"
    assert runs["cudagraph fp32"]["runs"] == 0 and runs["compile-ro fp32"]["suites"] == "grid_compile"
    g, f = preset("gpt2"), codesignview.VARIANTS["fasttransformer"]
    for i, (eager, graph) in enumerate(((10.0, 7.0), (18.0, 7.07), (12.0, 7.0))):
        write(step_row("baselines", "fasttransformer", f, 32, 256, "eager", "fp32", eager, run_id=f"r{i}",
                       machine_id=f"m{i % 2}", optimizer_kind="default"),
              step_row("baselines", "fasttransformer", f, 32, 256, "cudagraph", "fp32", graph, run_id=f"r{i}",
                       machine_id=f"m{i % 2}", optimizer_kind="fused"),
              step_row("baselines", "gpt2", g, 32, 256, "eager", "fp32", 5.0, run_id=f"r{i}",
                       machine_id=f"m{i % 2}", optimizer_kind="fused"))  # not the default placement
    scatter = {(r["model"], r["mode"]): r for r in codesignview.run_scatter.rows(codesignview.measured(SLUG))}
    assert set(scatter) == {("fasttransformer", "eager fp32"), ("fasttransformer", "cudagraph fp32")}
    assert scatter[("fasttransformer", "eager fp32")]["slowest / fastest"] == pytest.approx(1.8)
    assert scatter[("fasttransformer", "eager fp32")]["machine starts"] == 2
    table = codesignview.grid_table(codesignview.measured(SLUG))
    note = findings.effects_note(codesignview.switch_effects(table), codesignview.grid_runs(rows),
                                 codesignview.run_scatter(codesignview.measured(SLUG)))
    # Eager factors up to 1/0.7 = 43%: within an 80% scatter; the graph-replayed steps lie 1.0% apart.
    assert "1 run on 1 machine start" in note and "80% apart" in note and "43%, lies within" in note
    assert "at most 1.0% apart" in note


def test_chapter4_findings_read_the_graph_replayed_modes_and_say_what_rmsnorm_does():
    from ftlib.views import codesign_findings as findings

    write(*grid_rows("eager", "grid"), *grid_rows("compile-ro", "grid_compile"),
          *layout_pair("compile-ro", 6.0, 6.3, "a", "m0"))
    rows = codesignview.measured(SLUG)
    table = codesignview.grid_table(rows)
    text = findings.chapter4_findings(codesignview.switch_effects(table), codesignview.grid_runs(rows),
                                      codesignview.grid_runs(rows, ladder(), sources=codesignview.LADDER_SOURCES),
                                      codesignview.run_scatter(rows), codesignview.ladder_table(rows),
                                      codesignview.fallback_cost(rows))
    assert "fewer than a verdict needs" in text
    assert "**Fused SDPA**: speed-up 1.11× in compile-ro fp32." in text  # 1 / 0.9, eager left out
    assert "eager" not in text.split("**The original K/V layout**")[0].split("\n", 1)[1]
    # RMS factor 1.0 under compile-ro: no graph-replayed step is faster with it.
    assert "makes no graph-replayed step faster: 1.00× in compile-ro fp32 (within 2%: no change)" in text
    assert "compile-ro fp32, the 2× MLP (1.25×)" in text
    assert "compile-ro 1.05×" in text and "too few runs" in text


def test_profile_of_the_broadcast_layout_on_cpu_shows_the_math_backend():
    """A real (tiny, CPU) profile of the original K/V layout, read back through backend_table."""
    from ftlib.harness.profiling import profile_suite

    small = dict(n_layer=1, n_embd=64, n_head=8, block_size=16)
    rows = profile_suite(["fasttransformer"], ["eager"], ["fp32"], 2, 16, "cpu", steps=1, warmup=1,
                         timing_steps=2, kv_layout="broadcast", **small)
    assert rows[0]["status"] == "ok", rows[0].get("error")
    lines = {r["model"]: r for r in codesignview.backend_table.rows("cpu", include_cpu=True, precisions=("fp32",),
                                                                b=2, t=16, **small)}
    assert lines["fasttransformer-broadcast"]["SDPA backend (from trace)"] == "math"
    assert lines["fasttransformer"]["SDPA backend (from trace)"].startswith("not measured yet")
    assert POST_CLAIMED["speedup_T128"] == 1.58  # the claim chapter 7 tests, as the post states it


def test_the_chapter_runs_without_any_stored_rows(tmp_path):
    """A reader whose results folder is empty gets the chapter with its tables saying so, its captions
    naming no GPU, not a crash."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    book = Path(__file__).resolve().parents[1] / "book"
    env = {**os.environ, "FTLIB_RESULTS_DIR": str(tmp_path / "empty"), "FTLIB_STATIC_PNG": "0"}
    p = subprocess.run([sys.executable, "04_codesign.py"], cwd=book, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "no GPU rows" in p.stdout and "Measured on: nothing stored yet" in p.stdout
