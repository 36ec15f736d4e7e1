"""The engine's goals (chapter 6): validated, judged by the verdict rule over runs of the current engine only."""

from __future__ import annotations

import pytest
from synthetic_results import BASELINE_CASES as CASES
from synthetic_results import baselines_run as run_rows
from synthetic_results import fast

from ftlib.views import baselines as bv
from ftlib.views import engine_goals as eg

BF16 = eg.EngineGoal("fasttransformer", "bf16", min_speedup=1.5, max_ms=1.0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(label="llama", precision="bf16", min_speedup=1.5), "unknown model"),
    (dict(label="gpt2", precision="int8", min_speedup=1.5), "unknown precision"),
    (dict(label="gpt2", precision="bf16", min_speedup=0.0), "min_speedup"),
    (dict(label="gpt2", precision="bf16", min_speedup=1.2, max_ms=-1.0), "max_ms"),
])
def test_a_goal_is_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        eg.EngineGoal(**kwargs)


def test_the_goals_name_a_step_time_only_where_one_is_set():
    assert BF16.text() == "≤ 1.0 ms and ≥ 1.5×"
    assert eg.EngineGoal("gpt2", "tf32", min_speedup=1.2).text() == "≥ 1.2×"


def _runs(pairs, machines=("m0", "m1", "m0")):
    """Baselines runs of FastTransformer bf16: (engine ms, strongest compiled ms) per run."""
    rows = []
    for i, (eng, base) in enumerate(pairs):
        rows += run_rows(f"r{i}", machines[i % len(machines)],
                         fast(fasttransformer__engine__default=eng, fasttransformer__compile_ro__whole_step=base))
    return bv.load(CASES, rows=rows)


def _line(runs):
    return eg.goal_table.rows(runs, [BF16])[0]


def test_a_goal_is_met_only_when_every_run_meets_it():
    line = _line(_runs([(0.9, 1.5), (0.95, 1.6), (0.98, 1.5)]))
    assert line["step-time goal"] == "met" and line["speed-up goal"] == "met"
    assert line["engine ms"] == "0.950 ms (0.900–0.980 ms)" and line["runs"] == "3 runs on 2 machine starts"
    # One run slower than 1.0 ms: the runs disagree; and a speed-up under 1.5x in every run: missed.
    line = _line(_runs([(0.9, 1.2), (1.1, 1.3), (0.98, 1.2)]))
    assert line["step-time goal"] == "some runs meet it" and line["speed-up goal"] == "missed"
    assert line["closest run"] == "0.900 ms; 1.33×"


def test_no_verdict_without_enough_runs_or_machine_starts():
    assert _line(_runs([(0.9, 1.5), (0.95, 1.6)]))["speed-up goal"] == "too few runs"
    assert _line(_runs([(0.9, 1.5), (0.95, 1.6), (0.98, 1.5)], machines=("m0",)))["step-time goal"] == "too few runs"


def test_only_the_current_engine_is_judged():
    runs = _runs([(0.9, 1.5), (0.95, 1.6), (0.98, 1.5)])
    old = runs.assign(engine_config="without grad_into_buffer")
    assert eg.goal_table.rows(old, [BF16]) == []
    assert "No run has measured" in eg.goal_findings(old, [], [BF16])


def test_a_missed_goal_says_what_takes_the_time_or_that_no_profile_is_stored():
    text = eg.goal_findings(_runs([(1.4, 2.0), (1.45, 2.1), (1.42, 2.0)]), [], [BF16])
    assert "FastTransformer bf16, H200" in text and ": not met (step time missed, speed-up missed);" in text
    assert "No profile of this step is stored" in text
    met = eg.goal_findings(_runs([(0.9, 1.5), (0.95, 1.6), (0.98, 1.5)]), [], [BF16])
    assert ": met;" in met and "profile" not in met


def test_a_missed_goal_names_the_classes_furthest_above_their_floors():
    from test_ledger import probe_row

    from ftlib.views import ledger

    probe = probe_row(commit="abcdef0123456789")
    text = eg.goal_findings(_runs([(1.4, 2.0), (1.45, 2.1), (1.42, 2.0)]), [probe], [BF16])
    lines = sorted((x for x in ledger.ledger.rows([probe]) if x["above floor µs"]), key=lambda x: -x["above floor µs"])
    assert "Its profile (commit abcdef0) puts the captured step, timed one replay at a time" in text  # older rows
    back = eg.goal_findings(_runs([(1.4, 2.0), (1.45, 2.1), (1.42, 2.0)]),
                            [probe_row(commit="abcdef0123456789", step_timing="back to back")], [BF16])
    assert "Its profile (commit abcdef0) puts the captured step at" in back
    assert f"most of the time above them is in {lines[0]['class']} ({lines[0]['above floor µs']:,.0f} µs above)" in text


def test_the_summary_sorts_each_goal_by_its_state():
    met = _runs([(0.9, 1.5), (0.95, 1.6), (0.98, 1.5)])
    gpt2 = eg.EngineGoal("gpt2", "bf16", min_speedup=1.2)  # every run of the synthetic GPT-2: 10 ms against 10 ms
    text = eg.goal_summary(met, [BF16, gpt2])
    assert text == ("**The engine's goals, H200:** met: FastTransformer bf16 (≤ 1.0 ms and ≥ 1.5×); "
                    "not met: GPT-2 bf16 (≥ 1.2×).")


def test_a_goal_not_met_says_which_half_missed():
    text = eg.goal_findings(_runs([(1.4, 3.0), (1.45, 3.1), (1.42, 3.0)]), [], [BF16])
    assert "not met (step time missed, speed-up met)" in text


def test_the_states_name_the_half_of_a_two_part_goal_that_was_not_met():
    runs = _runs([(1.4, 3.0), (1.45, 3.1), (1.42, 3.0)])  # 2.1x every run, never under 1.0 ms
    want = "not met: FastTransformer bf16 (≤ 1.0 ms and ≥ 1.5×; its speed-up met, its step time not)"
    assert eg.goal_states(runs, "h200", [BF16]) == want
    both = _runs([(1.4, 2.0), (1.45, 2.1), (1.42, 2.0)])  # 1.43x: both halves missed, none named
    assert eg.goal_states(both, "h200", [BF16]) == "not met: FastTransformer bf16 (≤ 1.0 ms and ≥ 1.5×)"


def test_a_goal_without_a_run_of_the_current_engine_is_not_measured_where_others_are():
    runs = _runs([(0.9, 1.5), (0.95, 1.6), (0.98, 1.5)])
    gpt2 = eg.EngineGoal("gpt2", "bf16", min_speedup=1.2)
    # GPT-2's runs measured an earlier engine; the FastTransformer's the current one.
    runs.loc[runs["label"] == "gpt2", "engine_config"] = "without fuse_softmax_matmuls"
    line = eg.goal_table.rows(runs, [BF16, gpt2])[1]
    assert line["runs"] == "no run of the current engine" and eg.goal_state(line) == "not measured"
    assert eg.goal_states(runs, "h200", [BF16, gpt2]) == (
        "met: FastTransformer bf16 (≤ 1.0 ms and ≥ 1.5×); not measured at the current engine: GPT-2 bf16 (≥ 1.2×)")
    text = eg.goal_findings(runs, [], [BF16, gpt2])
    assert "**GPT-2 bf16, H200** (goal ≥ 1.2×): not measured yet" in text and "No profile" not in text
