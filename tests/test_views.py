"""Chapters 5 and 7 read stored rows through ftlib.views.sweep and ftlib.views.audit (chapter 4: test_codesignview).

Synthetic rows go into a temporary results directory (FTLIB_RESULTS_DIR), never into
data/results; their numbers are chosen so every ratio and verdict is known in advance.
"""

from __future__ import annotations

import pytest
from view_rows import DATE, SLUG, profile_row, step_row, write

from ftlib.analysis.backends import expected_backend
from ftlib.analysis.claims import POST_CLAIMED, POST_GPU, roofline_projection
from ftlib.model.config import preset
from ftlib.views import audit
from ftlib.views import sweep as sweepview

pytestmark = pytest.mark.usefixtures("results_root")  # results under tmp_path (conftest)


def sweep_pair(T: int, g_ms: float, f_ms: float, mode: str = "compile-ro", prec: str = "fp32",
               run: str = "r0", machine: str = "m0") -> list[dict]:
    B = 8192 // T
    return [step_row("tsweep", m, sweep_config, B, T, mode, prec, ms, run_id=run, machine_id=machine)
            for m, ms in (("gpt2", g_ms), ("fasttransformer", f_ms))
            for sweep_config in [sweepview.sweep_config(m, T)]]


def three_runs(make, *args, **kw) -> list[dict]:
    """The same pair measured in 3 runs on 2 machine starts: enough for a verdict."""
    return [r for i in range(3) for r in make(*args, run=f"r{i}", machine=f"m{i % 2}", **kw)]


# ------------------------------------------------------------------ chapter 5: the T sweep

def test_sweep_table_ratios_and_filters():
    write(*sweep_pair(128, 16.0, 10.0), *sweep_pair(256, 13.0, 10.0), *sweep_pair(128, 9.0, 9.0, prec="tf32"))
    write(step_row("tsweep", "gpt2", sweepview.sweep_config("gpt2", 512), 16, 512, "compile-ro", "fp32", 20.0,
                   run_id="r0", machine_id="m0"))
    # A row that does not name its run cannot be paired: it must not enter.
    write(step_row("tsweep", "fasttransformer", sweepview.sweep_config("fasttransformer", 512), 16, 512,
                   "compile-ro", "fp32", 1.0))
    # A smoke run of a smaller model at the same T and an other GPU's rows must not enter.
    write(step_row("tsweep", "fasttransformer", sweepview.sweep_config("fasttransformer", 128, n_layer=1), 64,
                   128, "compile-ro", "fp32", 1.0))
    write(*sweep_pair(128, 1.0, 100.0), slug="a100")
    table = sweepview.sweep_table.rows(sweepview.sweep_rows(SLUG))
    assert [r["T"] for r in table] == [128, 256, 512]
    assert table[0]["speed-up"] == pytest.approx(1.6) and table[1]["speed-up"] == pytest.approx(1.3)
    assert table[2]["speed-up"] is None and table[2]["gpt2 ms"] == 20.0  # FastTransformer not measured there
    assert table[0]["fasttransformer tokens/s"] == pytest.approx(8192 / 0.010)
    assert sweepview.sweep_table.rows(sweepview.sweep_rows(SLUG), "tf32")[0]["speed-up"] == pytest.approx(1.0)
    assert sweepview.sweep_table.rows(sweepview.sweep_rows(SLUG), "fp32", "eager") == []
    assert table[0]["runs"] == 1 and table[0]["verdict"].startswith("too few runs")


def test_sweep_table_is_the_median_over_runs_not_the_latest_run():
    # Three runs on two machine starts; the latest (r2) alone would say FastTransformer is slower.
    write(*sweep_pair(512, 16.0, 10.0, run="r0", machine="m0"), *sweep_pair(512, 14.0, 10.0, run="r1", machine="m1"))
    late = [dict(r, date="2026-12-04T10:00:00Z") for r in sweep_pair(512, 9.0, 10.0, run="r2", machine="m1")]
    write(*late)
    (line,) = sweepview.sweep_table.rows(sweepview.sweep_rows(SLUG))
    assert line["speed-up"] == pytest.approx(1.4) and line["gpt2 ms"] == pytest.approx(14.0)
    assert (line["speed-up min"], line["speed-up max"]) == (pytest.approx(0.9), pytest.approx(1.6))
    assert (line["runs"], line["machine starts"]) == (3, 2) and line["verdict"] == "no verdict: the runs disagree"
    assert sweepview.slower_at(sweepview.sweep_rows(SLUG), SLUG) == [
        "H200, fp32, compile-ro: at no T is FastTransformer slower than GPT-2 in every run; "
        "the runs disagree at T = 512."]


def test_the_speedup_figure_sets_each_series_of_one_T_apart_and_hovers_its_real_T():
    write(*three_runs(sweep_pair, 512, 16.0, 10.0), *three_runs(sweep_pair, 512, 12.0, 10.0, mode="eager"),
          *three_runs(sweep_pair, 512, 11.0, 10.0, prec="tf32"))
    figs = dict(sweepview.sweep_figures(sweepview.sweep_rows(SLUG), SLUG))
    series = {t.name: t for t in figs[f"fig5-speedup-{SLUG}"].data if t.name in ("fp32 reduce-overhead",
                                                                                  "fp32 eager", "tf32 reduce-overhead")}
    assert len(series) == 3 and all(list(t.customdata) == [512] for t in series.values())  # hover: the real T
    xs = [t.x[0] for t in series.values()]
    assert len(set(xs)) == 3 and all(abs(x / 512 - 1) < 0.05 for x in xs)  # apart, but each read at T = 512
    assert series["fp32 reduce-overhead"].y[0] == pytest.approx(1.6)  # only x moves


def test_slower_at_names_the_T_as_prose():
    for T in (128, 1024, 2048, 4096):
        write(*three_runs(sweep_pair, T, 10.0 if T > 128 else 16.0, 12.0, prec="tf32"))
    (line,) = sweepview.slower_at(sweepview.sweep_rows(SLUG), SLUG)
    assert line == ("H200, tf32, compile-ro: FastTransformer steps slower than GPT-2 in every run at "
                    "T = 1024, 2048 and 4096.")
    assert "[" not in line


def test_t4_projection_is_labelled_and_matches_the_roofline():
    proj = sweepview.t4_projection.rows((128, 1024))
    for p in proj:
        B, T = 8192 // p["T"], p["T"]
        g = roofline_projection(preset("gpt2", block_size=T), B, T, POST_GPU)["floor_ms"]
        f = roofline_projection(preset("fasttransformer", block_size=T), B, T, POST_GPU)["floor_ms"]
        assert p["floor ratio"] == pytest.approx(g / f) and p["B"] == B
        assert "projection" in p["source"] and "not a measurement" in p["source"]
    # GPT-2's (B,H,T,T) traffic grows with T at fixed tokens; FastTransformer's fused attention does not.
    assert proj[1]["floor ratio"] > proj[0]["floor ratio"] > 1


def test_compile_time_prefers_the_cold_process_rows():
    g, f = preset("gpt2"), preset("fasttransformer")
    run = dict(run_id="r0", machine_id="m0")
    write(step_row("fig1", "gpt2", g, 32, 256, "compile-ro", "fp32", 9.0, first_step_s=18.0, **run),
          step_row("fig1", "fasttransformer", f, 32, 256, "compile-ro", "fp32", 6.0, first_step_s=8.0, **run),
          step_row("compile_time", "gpt2", g, 32, 256, "compile-ro", "fp32", 9.0, first_step_s=20.0, **run),
          step_row("compile_time", "fasttransformer", f, 32, 256, "compile-ro", "fp32", 6.0, first_step_s=5.0, **run),
          step_row("compile_time", "gpt2", g, 32, 256, "cudagraph", "fp32", 11.0, first_step_s=0.5, **run))
    table = sweepview.compile_time_table.rows(SLUG)
    assert table[0]["source"].startswith("the compile-time runs") and table[0]["gpt2 / FT (median, min–max)"] == "4.00×"
    assert table[0]["runs"] == "1 run on 1 machine start"
    assert not [r for r in table if r["mode"] == "cudagraph"]  # no run measured both models there
    assert all(r["source"].startswith(("the compile-time runs", "post")) for r in table)  # a warm process's first step
    post = table[-1]
    assert post["device"] == POST_GPU and post["gpt2 / FT (median, min–max)"] == f"{4.31 / 1.22:.2f}×"


def _compile_pair(g_s: float, f_s: float, run: str, machine: str, date: str = DATE) -> list[dict]:
    return [step_row("compile_time", m, preset(m), 32, 256, "compile-ro", "fp32", 9.0, first_step_s=s,
                     run_id=run, machine_id=machine, date=date) for m, s in (("gpt2", g_s), ("fasttransformer", f_s))]


def test_compile_time_is_the_median_over_runs_and_agrees_with_the_audit():
    # The latest run (1.1x) alone would misstate the median over the four (1.2x).
    write(*_compile_pair(14.0, 11.2, "r0", "m0"), *_compile_pair(13.0, 10.4, "r1", "m1"),
          *_compile_pair(18.0, 13.0, "r2", "m1"), *_compile_pair(14.3, 13.0, "r3", "m1", "2026-12-04T10:00:00Z"))
    line = sweepview.compile_time_table.rows(SLUG)[0]
    per_run = sorted([14.0 / 11.2, 13.0 / 10.4, 18.0 / 13.0, 14.3 / 13.0])
    median = (per_run[1] + per_run[2]) / 2
    assert line["gpt2 first step s"] == pytest.approx(14.15) and line["runs"] == "4 runs on 2 machine starts"
    assert line["gpt2 / FT (median, min–max)"] == f"{median:.2f}× ({per_run[0]:.2f}–{per_run[-1]:.2f}×)"
    row = _claim(audit.audit_table.rows(SLUG), "first step (compile)")
    finds = row["book finds"]
    assert f"{median:.1f}× (" in finds and " over 4 runs on " in finds and "14.2 s -> " in finds


def test_eager_inversion_verdicts_come_from_the_rows():
    g, f = preset("gpt2"), preset("fasttransformer")
    write(step_row("fig1", "fasttransformer", f, 32, 256, "eager", "fp32", 16.8),
          step_row("fig1", "gpt2", g, 32, 256, "compile-ro", "fp32", 8.9))

    def inversion_pair(T, ft_eager, gpt2_ro, run="r0", machine="m0"):
        return [*[r for r in sweep_pair(T, 7.0, ft_eager, mode="eager", run=run, machine=machine)
                  if r["label"] == "fasttransformer"],
                *[r for r in sweep_pair(T, gpt2_ro, 4.0, run=run, machine=machine) if r["label"] == "gpt2"]]

    write(*inversion_pair(128, 5.0, 6.0))
    lines = sweepview.eager_inversion_table.rows(SLUG)
    assert lines[0]["source"].startswith("post") and lines[0]["verdict"] == "holds in the post's numbers"
    measured = {(r["source"].split(",")[0], r["T"]): r["verdict"] for r in lines[1:]}
    assert measured == {("the sequence sweep", 128): "too few runs (1 run on 1 machine start; a verdict needs 3 on 2)"}
    write(*inversion_pair(128, 5.0, 6.0, "r1", "m1"), *inversion_pair(128, 5.0, 6.0, "r2", "m0"))
    (line,) = sweepview.eager_inversion_table.rows(SLUG)[1:]
    assert line["verdict"] == "holds" and line["runs"] == "3 runs on 2 machine starts"
    # A latest run that says the opposite leaves the median, but takes the verdict away.
    write(*[dict(r, date="2026-12-04T10:00:00Z") for r in inversion_pair(128, 7.0, 6.0, "r3", "m1")])
    (line,) = sweepview.eager_inversion_table.rows(SLUG)[1:]
    assert line["FastTransformer eager ms"] == 5.0 and line["verdict"] == "no verdict: the runs disagree"


def test_eager_inversion_at_the_headline_shape_pairs_rows_of_each_run():
    from synthetic_results import baselines_run, fast

    from ftlib.harness.suites import baselines
    from ftlib.views import baseline_report as br
    from ftlib.views import baselines as bv

    rows = []
    for i, gpt2_ms in enumerate((8.0, 9.0, 12.0)):  # FastTransformer eager: 10 ms in every run
        rows += baselines_run(f"r{i}", f"m{i % 2}", fast(gpt2__compile_ro__default=gpt2_ms,
                                                         fasttransformer__eager__default=10.0), cases=baselines())
    inv = br.eager_inversion(bv.load(baselines(), rows=rows))
    post = inv[(inv["precision"] == "fp32") & (inv["GPT-2 compiled as"] == bv.config_name(*bv.POST_CONFIG))].iloc[0]
    assert post["GPT-2 compiled / FastTransformer eager (median, min–max)"] == "0.90× (0.80–1.20×)"
    assert post["inversion"] == "no verdict: the runs disagree"


# ------------------------------------------------------------------ chapter 7: verdicts from rows

def _claim(rows: list[dict], start: str) -> dict:
    found = [r for r in rows if r["claim"].startswith(start)]
    assert len(found) == 1, [r["claim"] for r in rows]
    return found[0]


@pytest.mark.parametrize("g_ms,verdict", [(16.0, "holds on H200 only"), (12.0, "does not hold")])
def test_audit_T128_claim_from_tsweep_rows(g_ms, verdict):
    write(*three_runs(sweep_pair, 128, g_ms, 10.0), *sweep_pair(128, 30.0, 10.0, prec="tf32"))  # tf32 must not count
    row = _claim(audit.audit_table.rows(SLUG), "speed-up at T=128")
    assert row["verdict"] == verdict and row["book finds"].startswith(f"{g_ms / 10:.2f}×, ")
    assert "in every one of 3 runs on 2 machine starts)" in row["book finds"]
    assert "on 2 machine starts" in row["book finds"]


def test_a_claim_that_holds_on_another_gpu_names_that_gpu():
    other = "h100-80gb-hbm3"
    write(*three_runs(sweep_pair, 128, 16.0, 10.0), slug=other)
    assert _claim(audit.audit_table.rows(other), "speed-up at T=128")["verdict"] == "holds on H100 80GB HBM3 only"
    assert _claim(audit.audit_table.rows(SLUG), "speed-up at T=128")["verdict"] == "not measured yet"  # none here


def test_audit_T128_claim_from_one_run_shows_it_without_a_verdict():
    write(*sweep_pair(128, 16.0, 10.0), *sweep_pair(128, 12.0, 10.0, run="r1", machine="m0"))
    row = _claim(audit.audit_table.rows(SLUG), "speed-up at T=128")
    assert row["verdict"] == "too few runs"
    assert "tok/s on the H200 (1.20–1.60× over 2 runs on 1 machine start)" in row["book finds"]


def test_audit_T128_claim_without_rows_says_how_to_measure():
    row = _claim(audit.audit_table.rows(SLUG), "speed-up at T=128")
    # A measurement on this GPU would answer it: "not measured yet", not "cannot test here" (a T4 timing's).
    assert row["verdict"] == "not measured yet" and "not measured yet" in row["book finds"]
    assert "1.58" in row["post says"]


def test_audit_compile_time_claim_uses_compile_time_rows_first():
    g, f = preset("gpt2"), preset("fasttransformer")
    fig1 = [step_row("fig1", "gpt2", g, 32, 256, "compile-ro", "fp32", 9.0, first_step_s=18.0),
            step_row("fig1", "fasttransformer", f, 32, 256, "compile-ro", "fp32", 6.0, first_step_s=8.0)]
    assert _claim(audit.audit_table.rows(SLUG), "first step (compile)")["verdict"] == "not measured yet"
    write(*fig1)  # a first step inside a warm process is not the compile time a user meets
    assert _claim(audit.audit_table.rows(SLUG), "first step (compile)")["verdict"] == "not measured yet"
    def pair(run, machine):
        return [step_row("compile_time", "gpt2", g, 32, 256, "compile-ro", "fp32", 9.0, first_step_s=20.0,
                         run_id=run, machine_id=machine),
                step_row("compile_time", "fasttransformer", f, 32, 256, "compile-ro", "fp32", 6.0,
                         first_step_s=5.0, run_id=run, machine_id=machine)]

    write(*pair("r0", "m0"))
    assert _claim(audit.audit_table.rows(SLUG), "first step (compile)")["verdict"] == "too few runs"  # 1 run
    write(*pair("r1", "m1"), *pair("r2", "m0"))
    row = _claim(audit.audit_table.rows(SLUG), "first step (compile)")
    assert row["verdict"] == "holds on H200 only"  # 4.0x
    assert row["from"].startswith("the compile-time runs (chapter 5)")
    assert ("20.0 s -> 5.0 s (medians over runs); GPT-2's over FastTransformer's in each run, the median: 4.0× "
            "(4.0× in every one of 3 runs" in row["book finds"])


@pytest.mark.parametrize("seen,verdict", [("math", "does not hold"), ("mem_efficient", "holds")])
def test_audit_sdpa_claim_reads_the_broadcast_trace(seen, verdict):
    # The expanded layout is listed first, so a reader that took the first FastTransformer row would see it.
    write(profile_row("fasttransformer", "fp32", "mem_efficient"), profile_row("fasttransformer-broadcast",
                                                                                "fp32", seen))
    row = _claim(audit.audit_table.rows(SLUG), "SDPA keeps")
    assert row["verdict"] == verdict and "from its trace" in row["book finds"]
    assert f"-> '{seen}'" in row["book finds"] and "view -> mem_efficient" in row["book finds"]


def test_audit_sdpa_claim_without_trace_gives_the_rules_expectation_and_no_verdict():
    row = _claim(audit.audit_table.rows(SLUG), "SDPA keeps")
    assert expected_backend(preset("fasttransformer", kv_layout="broadcast"), "fp32", (9, 0)) == "math"
    assert row["verdict"] == "not measured yet" and "expected by the kernel rules" in row["book finds"]
    assert "not measured yet" in row["book finds"] and "'s trace shows" not in row["book finds"]
    # Another GPU's trace is named beside this GPU's expectation, without giving this GPU a verdict.
    h100 = profile_row("fasttransformer-broadcast", "fp32", "math")
    write({**h100, "provenance": {**h100["provenance"], "device": "NVIDIA H100 80GB HBM3"}}, slug="h100-80gb-hbm3")
    row = _claim(audit.audit_table.rows(SLUG), "SDPA keeps")
    assert row["verdict"] == "not measured yet" and "the H100 80GB HBM3's trace shows 'math' (chapter 1)" in row[
        "book finds"]


def test_audit_compiler_ceiling_from_the_repeated_baselines_runs():
    from synthetic_results import baselines_run, fast

    from ftlib.harness.suites import baselines

    assert _claim(audit.audit_table.rows(SLUG), "step-time claims")["verdict"] == "not measured yet"
    rows = []
    for i, eng in enumerate((11.0, 10.5, 11.5)):  # GPT-2's engine against its strongest compiled step (9 ms)
        rows += baselines_run(f"r{i}", f"m{i % 2}", fast(gpt2__engine__default=eng, gpt2__compile_ro__fused=9.0),
                              cases=baselines())
    write(*rows)
    ceiling = [r for r in audit.audit_table.rows(SLUG) if r["claim"].startswith("compiler ceiling")]
    assert [r["verdict"] for r in ceiling] == ["holds on H200 only"] * 3  # fp32, tf32, bf16: slower in every run
    assert "0.82× (0.78–0.86× over runs)" in ceiling[0]["book finds"] and "107.21" in ceiling[0]["post says"]
    assert "measured fp32 only" in ceiling[1]["post says"] and "only" not in ceiling[0]["post says"]  # tf32, fp32
    speedup = _claim(audit.audit_table.rows(SLUG), "FastTransformer over GPT-2, compiled, fp32 (the post's setup")
    assert speedup["verdict"] == "does not hold" and speedup["book finds"].startswith("1.00×")  # 10 vs 10 ms


def test_what_we_found_speaks_per_precision_and_along_the_sweep():
    from synthetic_results import baselines_run

    from ftlib.harness.suites import baselines
    from ftlib.views import baselines as bv
    from ftlib.views.bench_findings import what_we_found

    rows = []
    for i, g in enumerate((15.0, 16.0, 17.0)):  # FastTransformer's strongest compiled step: 10 ms in every run
        gpt2 = {(c.label, c.mode, c.optimizer): g for c in baselines() if c.label == "gpt2"}
        rows += baselines_run(f"r{i}", f"m{i % 2}", gpt2, cases=baselines())
    runs = bv.load(baselines(), rows=rows)
    write(*three_runs(sweep_pair, 128, 16.0, 10.0), *three_runs(sweep_pair, 4096, 9.0, 10.0))
    text = what_we_found(runs, {SLUG: sweepview.sweep_rows(SLUG)})
    assert "1.60× (1.50–1.70× over runs); 3 runs on 2 machine starts; faster in every run." in text
    assert "the gain shrinks from 1.60× at T = 128 to 0.90× at T = 4096" in text
    assert "slower than GPT-2 in every run at T = 4096" in text
    one = what_we_found(bv.load(baselines(), rows=rows[: len(rows) // 3]))
    assert "too few runs for a verdict" in one and "faster in every run" not in one


def test_audit_convergence_claim_without_rows_stays_in_the_table_unmeasured():
    row = _claim(audit.audit_table.rows(SLUG), "perplexity at step 200")
    assert row["verdict"] == "not measured yet" and "ci/gpu_train.py --suites convergence-original" in row["book finds"]
    assert row["post says"] == "11.98 vs 12.45 (training batch)"


def test_chapter0_states_the_posts_figure_from_the_claims(monkeypatch):
    from ftlib.views import setup

    assert f"{POST_CLAIMED['speedup_compiled']:.3f}× as fast" in setup.claim_text()
    monkeypatch.setitem(POST_CLAIMED, "speedup_compiled", 1.5)
    assert "1.500× as fast" in setup.claim_text() and "+50.0%" in setup.claim_text()


def test_gpu_of_names_the_gpu_as_its_rows_do_without_the_vendor():
    """Prose says 'on the H200', not the folder's slug: the name comes from a row's ``device`` or its
    provenance's, from rows of that folder only, else the folder's name in capitals."""
    from ftlib.views.bench import gpu_of

    rows = [{"device_slug": "h100-80gb-hbm3", "device": "NVIDIA H100 80GB HBM3"},
            {"device_slug": "h200", "provenance": {"device": "NVIDIA H200"}}]
    assert gpu_of(rows, "h100-80gb-hbm3") == "H100 80GB HBM3"
    assert gpu_of(rows, "h200") == "H200"
    assert gpu_of(rows[:1], "h200") == "H200"
    assert gpu_of(rows, "l4") == "L4"
    assert gpu_of([{"device_slug": "a100", "device": "NVIDIA A100-SXM4-80GB"}], "a100") == "A100-SXM4-80GB"
    from ftlib.views.bench import gpu_label

    assert gpu_label("cpu") == "CPU" and gpu_label("h200 (this run)") == "H200 (this run)"
    assert gpu_label("t4") == "Tesla T4" and gpu_label("h200-nvl") == "H200 NVL"
    assert gpu_label(None) == "no GPU rows"  # a chapter with no stored rows at all


def test_a_claims_source_reads_in_words_with_its_runs_kept():
    assert audit.source_words("tsweep suite") == "the sequence sweep (chapter 5)"
    assert audit.source_words("baselines suite, 3 runs on 2 machine starts") == (
        "chapter 3's repeated runs, 3 runs on 2 machine starts")
    assert audit.source_words("ftlib.analysis.accounting rules") == "the accounting's SDPA backend rules (chapter 2)"
    assert audit.source_words("arithmetic on the post's numbers") == "arithmetic on the post's numbers"
    assert audit.source_words("configurations elsewhere") == "configurations elsewhere"  # a name, not a prefix
    sources = {r["from"] for r in audit.audit_table.rows(SLUG)}
    assert not [s for s in sources if "suite" in s or "ftlib." in s or s == "config"]  # no code names left
