"""How steady the strongest baseline is from run to run (ftlib.views.steadiness)."""

from __future__ import annotations

from synthetic_results import BASELINE_CASES as CASES
from synthetic_results import baselines_run as run_rows
from synthetic_results import fast

from ftlib.views import baselines as bv
from ftlib.views import steadiness as st


def _runs(whole_step_ms: list[float], breaks: int = 3):
    rows = []
    for i, ms in enumerate(whole_step_ms):
        bad = {("fasttransformer", "compile-ro", "whole-step"): {"graph_breaks": breaks}}
        rows += run_rows(f"r{i}", f"m{i % 2}", fast(fasttransformer__compile_ro__whole_step=ms,
                                                    fasttransformer__engine__default=1.0), bad=bad)
    return bv.load(CASES, rows=rows)


def test_a_baseline_that_moves_between_runs_is_named_with_what_it_leaves_to_the_host():
    tab = st.steadiness_table(_runs([1.6, 2.2, 1.7])).set_index("model").loc["FastTransformer"]
    assert tab["runs"] == 3 and tab["compiled spread %"] == 37.5
    assert tab["strongest baseline ms (min–max)"] == "1.700 (1.600–2.200)"
    assert tab["strongest configurations"] == "compile reduce-overhead, whole step compiled (3)"
    assert tab["graph breaks"] == 3 and tab["engine runs"] == 3 and tab["engine spread %"] == 0.0
    text = st.steadiness_findings(_runs([1.6, 2.2, 1.7]))
    assert "38% from fastest to slowest run: more than 5% apart" in text and "(3 graph breaks)" in text


def test_a_steady_baseline_is_called_steady_and_a_manual_graph_leaves_nothing_to_the_host():
    assert "0.6% from fastest to slowest run: steady" in st.steadiness_findings(_runs([1.60, 1.61, 1.60]))
    # Just past the threshold: one decimal, so that it does not read "5% ...: more than 5% apart".
    assert "5.4% from fastest to slowest run: more than 5% apart" in st.steadiness_findings(_runs([1.60, 1.6864, 1.62]))
    assert st.host_work("manual CUDA graph of the eager step", 0) is None
    assert st.host_work(bv.config_name("compile", "graphed"), 0) is None  # the compiled step, one graph
    assert st.host_work("compile reduce-overhead, fused AdamW outside", 0) == "AdamW launched from Python"
    assert st.host_work("compile reduce-overhead, whole step compiled", 3) == "3 graph breaks"
    assert st.steadiness_findings(_runs([1.6])) == ""  # one run: nothing to say about runs


def test_one_run_has_no_spread_to_show():
    tab = st.steadiness_table(_runs([1.6])).set_index("model").loc["FastTransformer"]
    assert tab["runs"] == 1 and tab["engine runs"] == 1
    assert tab["compiled spread %"] is None and tab["engine spread %"] is None  # shown as "–", not 0


def test_the_hosts_of_the_runs_are_named_where_rows_record_them():
    rows = []
    for i, (ms, host) in enumerate([(1.6, "EPYC A x16"), (2.2, "Xeon B x16"), (1.7, "EPYC A x16")]):
        rows += [dict(r, host_cpu=host) for r in run_rows(
            f"r{i}", f"m{i}", fast(fasttransformer__compile_ro__whole_step=ms, fasttransformer__engine__default=1.0),
            bad={("fasttransformer", "compile-ro", "whole-step"): {"graph_breaks": 3}})]
    df = bv.load(CASES, rows=rows)
    tab = st.steadiness_table(df).set_index("model").loc["FastTransformer"]
    assert tab["hosts"] == "EPYC A x16 (2 runs); Xeon B x16 (1 run)"
    assert "(hosts: EPYC A x16 (2 runs); Xeon B x16 (1 run))" in st.steadiness_findings(df)
    # Rows from before the field existed name no host.
    assert "hosts" not in st.steadiness_table(_runs([1.6, 2.2])).columns


def test_runs_that_name_no_host_say_nothing_of_hosts_beside_runs_that_do():
    named = [dict(r, host_cpu="EPYC A x16", device_slug="h100", device="NVIDIA H100") for i, ms in
             enumerate([1.6, 1.61]) for r in run_rows(f"n{i}", f"k{i}", fast(fasttransformer__compile_ro__whole_step=ms,
                                                                              fasttransformer__engine__default=1.0))]
    unnamed = [r for i, ms in enumerate([1.6, 2.2]) for r in run_rows(
        f"r{i}", f"m{i}", fast(fasttransformer__compile_ro__whole_step=ms, fasttransformer__engine__default=1.0),
        bad={("fasttransformer", "compile-ro", "whole-step"): {"graph_breaks": 3}})]
    text = st.steadiness_findings(bv.load(CASES, rows=named + unnamed))
    assert "more than 5% apart" in text and "(3 graph breaks)" in text
    assert "hosts: nan" not in text and "(hosts:" not in text


def test_each_strongest_configuration_names_its_own_host_work():
    """Where the strongest configuration differs between runs, each one's host work is named with it, the graph
    breaks of the whole-step compile not credited to a manual CUDA graph that won the other runs."""
    rows = []
    for i, (whole, graphed) in enumerate([(1.5, 1.6), (1.8, 1.7), (1.9, 1.7)]):
        rows += run_rows(f"r{i}", f"m{i % 2}", fast(fasttransformer__compile_ro__whole_step=whole,
                                                    fasttransformer__cudagraph__fused=graphed,
                                                    fasttransformer__engine__default=1.0),
                         bad={("fasttransformer", "compile-ro", "whole-step"): {"graph_breaks": 3},
                              ("fasttransformer", "cudagraph", "fused"): {"graph_breaks": 0}})
    tab = st.steadiness_table(bv.load(CASES, rows=rows)).set_index("model").loc["FastTransformer"]
    assert tab["strongest configurations"] == ("manual CUDA graph of the eager step (2); "
                                               "compile reduce-overhead, whole step compiled (1)")
    assert tab["host work each step"] == "compile reduce-overhead, whole step compiled: 3 graph breaks"
