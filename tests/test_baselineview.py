"""The baselines suite's views: strongest baseline, same-run pairing, complete runs, spread and verdicts."""

from __future__ import annotations

import pytest
from synthetic_results import BASELINE_CASES as CASES
from synthetic_results import BASELINE_MODELS, fast
from synthetic_results import baselines_run as run_rows

from ftlib.harness.bench.cases import Case
from ftlib.harness.suites import LATER_STEP_CONFIGS
from ftlib.views import baseline_report as br
from ftlib.views import baselines as bv
from ftlib.views import ceiling


def test_the_strongest_baseline_is_the_fastest_correct_compiled_configuration():
    ms = fast(gpt2__compile_ro__fused=4.0, gpt2__compile_ro__whole_step=3.0, gpt2__eager__default=1.0,
              gpt2__engine__default=2.0, gpt2__cudagraph__fused=5.0)
    # The fastest of all is a compiled configuration whose loss check failed: it does not count.
    rows = run_rows("r1", "m1", {**ms, ("gpt2", "compile", "fused"): 0.5},
                    bad={("gpt2", "compile", "fused"): {"check_ok": False}})
    best = bv.strongest(bv.load(CASES, rows=rows)).set_index("label")
    assert best.loc["gpt2", "baseline_ms"] == 3.0  # eager (1.0) and the engine (2.0) are not baselines
    assert best.loc["gpt2", "baseline"] == "compile reduce-overhead, whole step compiled"
    errored = run_rows("r1", "m1", ms, bad={("gpt2", "compile-ro", "whole-step"): {"status": "error"}})
    assert bv.strongest(bv.load(CASES, rows=errored)).set_index("label").loc["gpt2", "baseline_ms"] == 4.0


def test_the_manual_cuda_graph_can_be_the_strongest_baseline():
    rows = run_rows("r1", "m1", fast(fasttransformer__cudagraph__fused=2.0))
    best = bv.strongest(bv.load(CASES, rows=rows)).set_index("label")
    assert best.loc["fasttransformer", "baseline"] == "manual CUDA graph of the eager step"


def test_ratios_pair_rows_of_one_run_only():
    # Run 1: engine 2, baseline 4 (2x). Run 2: engine 4, baseline 2 (0.5x). Pairing across the runs
    # would give 1x or 4x; within each run it gives 2x and 0.5x.
    r1 = run_rows("r1", "m1", fast(gpt2__engine__default=2.0, gpt2__compile_ro__fused=4.0))
    r2 = run_rows("r2", "m2", fast(gpt2__engine__default=4.0, gpt2__compile_ro__fused=2.0))
    per_run = bv.speedups(bv.load(CASES, rows=r1 + r2))
    got = per_run[per_run["label"] == "gpt2"].set_index("run_id")["speedup"]
    assert got["r1"] == pytest.approx(2.0) and got["r2"] == pytest.approx(0.5)


def test_incomplete_runs_and_uncommitted_code_are_left_out():
    full = run_rows("full", "m1", {})
    partial = run_rows("partial", "m1", {}, skip=(("gpt2", "engine", "default"),))
    dirty = run_rows("dirty", "m2", {}, commit="0123456789ab+dirty")
    legacy = [{k: v for k, v in r.items() if k != "run_id"} for r in run_rows("legacy", "m3", {})]
    df = bv.load(CASES, rows=full + partial + dirty + legacy)
    assert set(df["run_id"]) == {"full", "partial"}
    kept = df[df["run_id"] == "partial"]
    assert set(kept["label"]) == {"fasttransformer"}  # GPT-2 lacks a configuration in that run: none of it
    assert bv.model_speedups(df)["run_id"].unique().tolist() == ["full"]  # a ratio needs both models
    mine = bv.load(CASES, rows=dirty, tag="this run")  # a reader's own run is shown, under its own name
    assert set(mine["device_slug"]) == {"h200 (this run)"}


def test_a_configuration_added_later_counts_where_measured_and_is_not_required():
    later = [Case(label, cfg, 32, 256, mode, "bf16", optimizer=opt) for label, cfg in BASELINE_MODELS.items()
             for mode, opt in LATER_STEP_CONFIGS]
    cases = CASES + later
    old = run_rows("old", "m1", fast(fasttransformer__compile_ro__fused=3.0))  # stored before it existed
    new = run_rows("new", "m2", {**fast(fasttransformer__compile_ro__fused=3.0),
                                 ("fasttransformer", "compile-ro", "whole-step-ca"): 2.0}, cases=cases)
    df = bv.load(cases, rows=old + new)
    assert set(df["run_id"]) == {"old", "new"}  # the older run is still complete
    best = bv.strongest(df).set_index(["run_id", "label"])
    assert best.loc[("new", "fasttransformer"), "baseline"] == (
        "compile reduce-overhead, whole step and compiled autograd")
    assert best.loc[("new", "fasttransformer"), "baseline_ms"] == 2.0
    # The new configuration was the strongest where measured: the run without it has no strongest baseline
    # for that model (its fastest, 3.0 ms, is of a weaker set), and says so; GPT-2's, where it did not win, stays.
    assert ("old", "fasttransformer") not in best.index and ("old", "gpt2") in best.index
    assert ("old", "fasttransformer") not in bv.speedups(df).set_index(["run_id", "label"]).index
    out = bv.runs_left_out(df)
    assert out.to_dict("records") == [{"device_slug": "h200", "label": "fasttransformer", "precision": "bf16",
                                       "runs left out": 1,
                                       "lacking": "compile reduce-overhead, whole step and compiled autograd"}]
    # A configuration of the original list is still required.
    short = run_rows("short", "m3", {}, skip=(("fasttransformer", "compile-ro", "whole-step"),), cases=cases)
    assert "fasttransformer" not in set(bv.load(cases, rows=short)["label"])


@pytest.mark.parametrize("lo,hi,runs,machines,want", [
    (1.10, 1.30, 3, 2, "faster"),
    (0.80, 0.95, 3, 2, "slower"),
    (0.99, 1.01, 3, 2, "ties"),
    (0.90, 1.10, 3, 2, "no verdict: the runs disagree"),
    (1.10, 1.30, 2, 2, "too few runs (2 runs on 2 machine starts; a verdict needs 3 on 2)"),
    (1.10, 1.30, 3, 1, "too few runs (3 runs on 1 machine start; a verdict needs 3 on 2)"),
])
def test_a_verdict_needs_every_run_on_one_side_and_enough_runs(lo, hi, runs, machines, want):
    assert bv.verdict(lo, hi, runs, machines) == want


def test_engine_summary_names_the_baseline_and_the_spread():
    rows = []
    for i, (eng, base) in enumerate([(2.0, 3.0), (2.0, 2.8), (2.0, 3.2)]):
        rows += run_rows(f"r{i}", f"m{i % 2}", fast(fasttransformer__engine__default=eng,
                                                      fasttransformer__compile_ro__whole_step=base))
    tab = br.engine_speedup_table(bv.load(CASES, rows=rows)).set_index("model")
    ft = tab.loc["FastTransformer"]
    assert ft["strongest baseline"] == "compile reduce-overhead, whole step compiled"
    assert ft["engine speed-up (median, min–max)"] == "1.50× (1.40–1.60×)"
    assert ft["verdict"] == "faster" and ft["runs"] == "3 runs, 2 machine starts"


def test_the_placement_effect_shows_each_baseline_of_the_same_run():
    rows = run_rows("r1", "m1", fast(gpt2__engine__default=3.0, gpt2__compile_ro__default=6.0,
                                     gpt2__compile_ro__fused=4.0, gpt2__compile_ro__whole_step=3.5))
    tab = br.placement_effect(bv.load(CASES, rows=rows))
    got = tab[tab["model"] == "GPT-2"].set_index("engine measured against")["engine speed-up (median, min–max)"]
    assert got["compile reduce-overhead, foreach AdamW outside"].startswith("2.00×")
    assert got["compile reduce-overhead, fused AdamW outside"].startswith("1.33×")
    assert got["strongest baseline of the run"].startswith("1.17×")
    assert set(tab["runs"]) == {bv.runs_on_starts(1, 1)}  # the runs behind each median, said beside it


def test_the_placement_effect_without_a_run_of_the_current_engine_keeps_its_columns():
    # Every engine row ran an earlier engine (here: one stored before any option was recorded as applied).
    older = {("gpt2", "engine", "default"): {"engine": {}}, ("fasttransformer", "engine", "default"): {"engine": {}}}
    rows = run_rows("r1", "m1", fast(gpt2__engine__default=3.0, gpt2__compile_ro__fused=4.0), bad=older)
    tab = br.placement_effect(bv.load(CASES, rows=rows))
    assert tab.empty and list(tab.columns) == br.PLACEMENT_COLUMNS
    assert tab[tab["model"] == "GPT-2"].empty  # what the findings select from it


def test_model_ratios_compare_the_two_models_in_the_same_configuration_and_at_their_best():
    rows = run_rows("r1", "m1", fast(gpt2__compile_ro__default=9.0, fasttransformer__compile_ro__default=6.0,
                                     gpt2__compile_ro__whole_step=8.0, fasttransformer__compile_ro__fused=5.0))
    tab = br.model_table(bv.load(CASES, rows=rows)).set_index("configuration")
    assert tab.loc["compile reduce-overhead, foreach AdamW outside", "speed-up (median, min–max)"].startswith("1.50×")
    assert tab.loc["strongest baseline of each", "speed-up (median, min–max)"].startswith("1.60×")


def test_the_findings_are_computed_from_the_rows():
    rows = []
    for i in range(3):
        rows += run_rows(f"r{i}", f"m{i % 2}", fast(gpt2__compile_ro__default=9.0 + i / 10,
                                                      fasttransformer__compile_ro__default=6.0))
    text = ceiling.chapter3_findings(bv.load(CASES, rows=rows), precision="bf16")
    assert "1.52× (1.50–1.53× over runs)" in text and "3 runs on 2 machine starts" in text
    assert ceiling.chapter3_findings(bv.load(CASES, rows=[])).startswith("No complete run")
    # A device without runs in the chapter's precision says so, not "0 runs on 0 machine starts".
    other = ceiling.chapter3_findings(bv.load(CASES, rows=rows), precision="fp32")
    assert other.startswith("**H200** (no fp32 runs; bf16: 3 runs on 2 machine starts):")
    assert "0 runs" not in other and "1.52× (1.50–1.53× over runs)" in other  # the precision it has, read instead
    assert "the post claims" not in other  # the post's 1.445× is an fp32 claim
    # A run that measured one model alone counts for that model: the heading gives each model's runs.
    alone = [r for r in run_rows("r9", "m9", {}) if r["label"] == "fasttransformer"]
    both = ceiling.chapter3_findings(bv.load(CASES, rows=rows + alone), precision="bf16")
    assert both.startswith("**H200** (bf16: GPT-2 3 runs on 2 machine starts, FastTransformer 4 runs on 3 machine "
                           "starts):")


def test_a_run_cut_short_keeps_the_precisions_it_completed():
    from ftlib.harness.bench.cases import Case

    both = CASES + [Case(c.label, c.config, c.B, c.T, c.mode, "fp16", optimizer=c.optimizer) for c in CASES
                    if c.optimizer != "whole-step"]
    rows = run_rows("r1", "m1", {}, cases=both, skip=(("gpt2", "engine", "default"),))  # skips it in both
    rows += run_rows("r1", "m1", {}, cases=[c for c in CASES if (c.label, c.mode) == ("gpt2", "engine")])
    df = bv.load(both, rows=rows)
    assert set(df["precision"]) == {"bf16", "fp16"}
    # fp16 lacks GPT-2's engine row: GPT-2's fp16 rows go, FastTransformer's stay
    assert set(df[df["precision"] == "fp16"]["label"]) == {"fasttransformer"}
    assert set(df[df["precision"] == "bf16"]["label"]) == {"gpt2", "fasttransformer"}


def test_engine_ratios_never_pool_runs_of_another_engine():
    # Runs r1 and r2 measured an engine without an option that is a default now (2x and 3x); run r3 measured
    # the current engine (1.25x). The engine's ratio is r3's alone; the older engine is its own configuration.
    older = {"engine": {"grad_into_buffer": False, "fuse_kv_split_sum": False, "norm_dw_into_buffer": True,
                        "norm_bwd_grid": "8 rows 4/SM", "first_norm_into_buffer": True, "wgrad_side_stream": True,
                        "attention_bwd_streams": True, "attention_kv_split": 2, "fuse_embedding": True,
                        "relaxed_atomics": True, "fuse_head_loss": True,
                        "attention_heavy_first": True, "explicit_heavy_first": True}}
    bad = {("fasttransformer", "engine", "default"): older}
    def ms(engine: float, compiled: float) -> dict:
        return fast(fasttransformer__engine__default=engine, fasttransformer__compile_ro__fused=compiled)

    r1, r2 = run_rows("r1", "m1", ms(2.0, 4.0), bad=bad), run_rows("r2", "m2", ms(2.0, 6.0), bad=bad)
    r3 = run_rows("r3", "m2", ms(4.0, 5.0))
    df = bv.load(CASES, rows=r1 + r2 + r3)
    tab = bv.engine_table(df)
    ft = tab[tab["label"] == "fasttransformer"].set_index("engine_config")
    now = "the current defaults"
    assert ft.loc[now, "median"] == pytest.approx(1.25) and ft.loc[now, "runs"] == 1
    old = ft.loc["without grad_into_buffer, fuse_kv_split_sum"]
    assert old["median"] == pytest.approx(2.5) and old["runs"] == 2  # 2x and 3x: its own line
    newest = bv.newest_engine(tab).set_index("label").loc["fasttransformer"]
    assert newest["engine_config"] == "the current defaults" and newest["median"] == pytest.approx(1.25)
    # Where only an earlier engine was measured, it is the newest, and its note says how far behind it was.
    only_old = bv.newest_engine(bv.engine_table(bv.load(CASES, rows=r1 + r2))).set_index("label")
    assert only_old.loc["fasttransformer", "engine_config"] == "without grad_into_buffer, fuse_kv_split_sum"
    assert bv.engine_note(only_old.loc["fasttransformer", "engine_config"]) == (
        " (an earlier engine: 2 of today's default options off; chapter 6 names them)")
    eff = br.placement_effect(df).set_index(["model", "engine measured against"])
    strongest = eff.loc[("FastTransformer", "strongest baseline of the run"), "engine speed-up (median, min–max)"]
    assert strongest.startswith("1.25×")
    configs = set(df[df["mode"] == "engine"]["config"])
    assert configs == {"engine", "engine, without grad_into_buffer, fuse_kv_split_sum"}
    # GPT-2 has no split sum to fuse: its older engine lacks grad_into_buffer only.
    g2 = run_rows("r4", "m3", {}, bad={("gpt2", "engine", "default"): older})
    assert "engine, without grad_into_buffer" in set(bv.load(CASES, rows=g2)["config"])


def test_compiled_autograd_is_set_against_the_same_whole_step_in_each_run():
    later = [Case(label, cfg, 32, 256, mode, "bf16", optimizer=opt) for label, cfg in BASELINE_MODELS.items()
             for mode, opt in LATER_STEP_CONFIGS]
    cases = CASES + later
    graphs = {"compiled_graphs": 4, "graph_breaks": 3}
    ca = ("fasttransformer", "compile-ro", "whole-step-ca")
    rows = []
    for i, (whole, with_ca) in enumerate(((2.0, 4.0), (2.5, 4.5))):
        rows += run_rows(f"r{i}", f"m{i}", {("fasttransformer", "compile-ro", "whole-step"): whole, ca: with_ca},
                         cases=cases, bad={ca: graphs})
    rows += run_rows("old", "m3", fast(fasttransformer__compile_ro__whole_step=1.0))  # no compiled autograd: left out
    lines = ceiling.compiled_autograd_findings(bv.load(cases, rows=rows), "h200")
    ft = [s for s in lines if s.startswith("FastTransformer bf16")]
    # Two runs on two machine starts: slower in both, but too few for a verdict.
    assert len(ft) == 1 and ("1.90× (1.80–2.00× over runs) as long (2 runs on 2 machine starts; verdict: too few "
                             "runs)") in ft[0], lines
    assert "4 graphs and 3 graph breaks" in ft[0]
    rows += run_rows("r2", "m0", {("fasttransformer", "compile-ro", "whole-step"): 2.0, ca: 3.0}, cases=cases,
                     bad={ca: graphs})
    (ft,) = [s for s in ceiling.compiled_autograd_findings(bv.load(cases, rows=rows), "h200")
             if s.startswith("FastTransformer bf16")]
    assert "(3 runs on 2 machine starts; verdict: slower)" in ft
    # In the chapter's closing, under a heading of its own, after the fp32 lines of the device.
    text = ceiling.chapter3_findings(bv.load(cases, rows=rows))
    assert "\n\nCompiled autograd on the H200, each precision, in the runs that measured" in text
    assert text.index("Compiled autograd on the H200") < text.index("- FastTransformer bf16: compile reduce-overhead")
    assert ceiling.verdict_phrase("no verdict: the runs disagree") == "no verdict: the runs disagree"
    assert ceiling.compiled_autograd_findings(bv.load(cases, rows=rows), "t4") == []


def test_the_step_time_figure_names_each_engine_bar_with_fewer_runs():
    # Runs r1 and r2 measured an earlier GPT-2 engine, r3 the current one: the compiled bars have 3 runs,
    # GPT-2's engine bar 1, the FastTransformer's engine bar 3.
    older = {"engine": {"grad_into_buffer": False, "norm_dw_into_buffer": True, "norm_bwd_grid": "8 rows 4/SM",
                        "first_norm_into_buffer": True}}
    bad = {("gpt2", "engine", "default"): older}
    rows = run_rows("r1", "m1", {}, bad=bad) + run_rows("r2", "m2", {}, bad=bad) + run_rows("r3", "m2", {})
    df = bv.load(CASES, rows=rows)
    dev, prec = df["device_slug"].iloc[0], df["precision"].iloc[0]
    title = br.config_figure(df, dev, prec).layout.title.text
    assert "median of 3 runs (the engine bars over fewer: GPT-2's 1); bars span" in title, title
    assert "FastTransformer's engine" not in title
    assert "earlier" not in title and all("engine (an earlier one)" not in tr.y for tr in
                                          br.config_figure(df, dev, prec).data)
    same = br.config_figure(bv.load(CASES, rows=run_rows("r4", "m3", {})), dev, prec).layout.title.text
    assert "median of 1 run; bars span" in same, same
    assert "a missing bar" not in same  # every configuration has both models' rows here
    # A configuration added to the suite later has fewer runs: the subtitle gives the range, not the most.
    late = [c for c in CASES if not (c.label == "gpt2" and c.mode == "eager")]
    mixed = bv.load(CASES, rows=run_rows("r5", "m4", {}, cases=late) + run_rows("r6", "m5", {}))
    title = br.config_figure(mixed, dev, prec).layout.title.text
    assert "median over each bar's runs, 1–2 (the engine bars over fewer: " in title, title
    fewer = [c for c in CASES if not (c.label == "gpt2" and c.mode == "eager")]  # a suite without GPT-2 eager
    gap = br.config_figure(bv.load(fewer, rows=run_rows("r4", "m3", {}, cases=fewer)), dev, prec).layout.title.text
    assert "a missing bar: no run here measured that model in that configuration" in gap, gap
    # Where no run measured GPT-2's current engine, its newest earlier engine gets a bar of its own, said so.
    fig = br.config_figure(bv.load(CASES, rows=rows[: 2 * len(rows) // 3]), dev, prec)
    assert "GPT-2's engine bar: an earlier engine (no run of the current one here)" in fig.layout.title.text
    bars = {tr.name: {y: x for y, x in zip(tr.y, tr.x) if x == x} for tr in fig.data}  # the bars drawn (x not NaN)
    assert "engine (an earlier one)" in bars["GPT-2"] and "engine" not in bars["GPT-2"]
    assert "engine" in bars["FastTransformer"] and "engine (an earlier one)" not in bars["FastTransformer"]
    # The throughput figure likewise: GPT-2's earlier engine on a bar named so, FastTransformer's current one.
    fig = br.throughput_figure(bv.load(CASES, rows=rows[: 2 * len(rows) // 3]), dev)
    names = {tr.name: list(tr.x[1]) for tr in fig.data}
    assert br.EARLIER in names["GPT-2"] and "engine" not in names["GPT-2"]
    assert "engine" in names["FastTransformer"] and br.EARLIER not in names["FastTransformer"]
    assert "earlier engine: no run of the current one here" in fig.layout.title.text.replace("<br>", " ")


def test_the_left_out_note_names_the_runs_and_what_they_lack():
    from ftlib.views import baseline_report as br

    later = [Case(label, cfg, 32, 256, mode, "bf16", optimizer=opt) for label, cfg in BASELINE_MODELS.items()
             for mode, opt in LATER_STEP_CONFIGS]
    old = run_rows("old", "m1", {}) + run_rows("old2", "m2", {})
    new = run_rows("new", "m2", {("fasttransformer", "compile", "graphed"): 1.0}, cases=CASES + later)
    note = br.left_out_note(bv.load(CASES + later, rows=old + new))
    assert note.endswith("- H200, FastTransformer bf16: 2 runs without *manual CUDA graph of the compiled step*")
    assert br.left_out_note(bv.load(CASES, rows=old)) == ""


def test_the_headroom_floor_is_chapter_2s_eager_step_floor_and_named_so():
    """Chapter 6's headroom sets the compiled step against the floor of chapter 2's accounting, which
    counts the bytes an eager step moves; a fused step (GPT-2's engine) can run under it, so the column says
    whose floor it is, under the name chapter 2 gives it."""
    from ftlib.analysis.peaks import lookup, step_floor
    from ftlib.harness.suites import headline_models
    from ftlib.views.accounting import floors_table

    rows = run_rows("r1", "m1", fast(gpt2__compile_ro__whole_step=3.0))
    head = bv.headroom(bv.load(CASES, rows=rows))
    assert "eager-step floor ms" in floors_table.rows()[0]
    line = head[head["model"] == "GPT-2"].iloc[0]
    floor = step_floor(headline_models()["gpt2"], 32, 256, lookup("NVIDIA H200"), line["precision"])["floor_s"]
    assert line["eager-step floor ms"] == pytest.approx(1e3 * floor)
    ratio = line["fastest compiled ms"] / line["eager-step floor ms"]
    assert line["compiled / eager-step floor"] == pytest.approx(ratio)


def test_the_precision_table_shows_the_configuration_behind_the_strongest_line():
    """Chapter 5's table: where the manual CUDA graph of the compiled step is each model's fastest, its own line
    stands beside 'strongest baseline of each', so that the reader sees where that line's times come from."""
    later = [Case(label, cfg, 32, 256, mode, "bf16", optimizer=opt) for label, cfg in BASELINE_MODELS.items()
             for mode, opt in LATER_STEP_CONFIGS]
    rows = run_rows("r1", "m1", {("fasttransformer", "compile", "graphed"): 1.0, ("gpt2", "compile", "graphed"): 2.0},
                    cases=CASES + later)
    tab = br.precision_table(bv.load(CASES + later, rows=rows)).set_index("configuration")
    graphed, best = tab.loc["manual CUDA graph of the compiled step"], tab.loc["strongest baseline of each"]
    assert (graphed["FastTransformer ms"], graphed["GPT-2 ms"]) == (best["FastTransformer ms"], best["GPT-2 ms"])
