"""The findings (ftlib.views.findings) on synthetic baselines runs stored as the h200's rows: the engine's
ratios come from the runs that measured the current engine alone, never pooled with runs of an engine that
lacked one of the current defaults."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from synthetic_results import baselines_run, fast

from ftlib.views import engine_findings as ef
from ftlib.views import findings

# The engine's describe() in a run stored before two of the current defaults existed.
OLDER = {("fasttransformer", "engine", "default"): {"engine": {"grad_into_buffer": False,
                                                                "fuse_kv_split_sum": False,
                                                                "norm_dw_into_buffer": True,
                                                                "norm_bwd_grid": "8 rows 4/SM",
                                                                "first_norm_into_buffer": True,
                                                                "wgrad_side_stream": True,
                                                                "attention_bwd_streams": True,
                                                                "attention_kv_split": 2, "fuse_embedding": True,
                                                                "relaxed_atomics": True, "fuse_head_loss": True,
                                                                "attention_heavy_first": True,
                                                                "explicit_heavy_first": True}}}


@pytest.fixture()
def store(tmp_path, monkeypatch) -> Callable[[list[dict]], None]:
    """Writes rows as the only stored baselines rows of the h200 (a temporary results folder)."""
    root = tmp_path / "results"
    monkeypatch.setenv("FTLIB_RESULTS_DIR", str(root))
    monkeypatch.delenv("FTLIB_MY_RESULTS", raising=False)

    def write(rows: list[dict], device: str = "h200") -> None:
        (root / device).mkdir(parents=True, exist_ok=True)
        (root / device / "baselines.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return write


def _three_runs() -> list[dict]:
    """Runs r1 and r2 measured the older engine (2x and 3x the strongest compiled step), run r3 today's
    engine (1.25x); the strongest compiled step is reduce-overhead with fused AdamW in each."""
    def ms(engine: float, compiled: float) -> dict:
        return fast(fasttransformer__engine__default=engine, fasttransformer__compile_ro__fused=compiled)

    return (baselines_run("r1", "m1", ms(2.0, 4.0), bad=OLDER) + baselines_run("r2", "m2", ms(2.0, 6.0), bad=OLDER)
            + baselines_run("r3", "m3", ms(4.0, 5.0)))


def _on(device: str, name: str, rows: list[dict]) -> list[dict]:
    """The rows as measured on another device."""
    return [{**r, "device_slug": device, "device": name} for r in rows]


def _graphed_run(run: str, machine: str, engine: float, graphed: float) -> list[dict]:
    """A run that also measured the manual CUDA graph of the compiled step (FastTransformer compile-ro with fused
    AdamW: 5 ms; GPT-2's graphed step at the default 10 ms, never its strongest)."""
    from synthetic_results import BASELINE_CASES, BASELINE_MODELS

    from ftlib.harness.bench.cases import Case

    extra = [Case(label, cfg, 32, 256, "compile", "bf16", optimizer="graphed")
             for label, cfg in BASELINE_MODELS.items()]
    ms = {**fast(fasttransformer__engine__default=engine, fasttransformer__compile_ro__fused=5.0),
          ("fasttransformer", "compile", "graphed"): graphed}
    return baselines_run(run, machine, ms, cases=BASELINE_CASES + extra)


def _ft_bf16(device: str = "h200") -> dict:
    tab = ef.engine_results(device)
    (row,) = tab[(tab["model"] == "FastTransformer") & (tab["precision"] == "bf16")].to_dict("records")
    return row


def test_the_engine_headline_is_the_ratio_of_todays_engine_alone(store):
    store(_three_runs())
    ft = _ft_bf16()
    # r3's 1.25x alone: pooled with r1 and r2 it would read 2.00× (1.25–3.00×).
    assert ft["engine speed-up"] == "1.25×"
    assert ft["strongest baseline of the same run"] == "compile reduce-overhead, fused AdamW outside"
    assert (ft["engine ms"], ft["its ms"]) == (4.0, 5.0)
    assert (ft["runs"], ft["verdict"], ft["engine"]) == ("1 run on 1 machine start", "too few runs", "current engine")
    # Where only the older engine was measured, its ratio stands alone, named by how many of today's defaults it lacked.
    store(_three_runs()[: 2 * len(baselines_run("r", "m", {}))])
    old = _ft_bf16()
    assert old["engine speed-up"] == "2.50× (2.00–3.00×)"
    assert old["engine"] == "an earlier engine: 2 of today's default options off; chapter 6 names them"
    assert old["runs"] == "2 runs on 2 machine starts"


def test_the_readme_block_shows_the_engine_table_and_no_sentence_for_it(store):
    store(_three_runs())
    text = findings.markdown("h200")
    assert ef.ENGINE_INTRO in text
    header = "| " + " | ".join(ef.ENGINE_COLUMNS) + " |"
    line = next(x for x in text.splitlines() if x.startswith("| FastTransformer | bf16 |"))
    assert header in text and line.split(" | ")[2:6] == ["4.000", "compile reduce-overhead, fused AdamW outside",
                                                         "5.000", "1.25×"]
    assert "fastest FastTransformer step" not in text


def test_no_rows_no_engine_table(store):
    store([])  # no speedrun rows in the store either
    assert ef.engine_results("h200").empty
    assert "Beyond the post" not in findings.markdown("h200")


def test_the_lessons_count_the_runs_of_todays_engine_behind_its_ratio(store):
    store(_three_runs())
    text = findings.lessons("h200")
    assert ("1.25× faster than the strongest compiled step of the run (over the 1 run on 1 "
            "machine start that measured the current engine)") in text


def test_the_lessons_are_per_gpu_and_the_advice_comes_once(store):
    """Chapter 10 prints each GPU's lessons under its name, then the advice once: the advice is no lesson of a
    GPU, and the co-design line ends its sentence before pointing to chapter 5, not in a second bracket."""
    store(_three_runs())
    text = findings.lessons("h200")
    assert "What to try" not in text and findings.WHAT_TO_TRY.startswith("**What to try on your own GPU:**")
    assert ") (chapter 5" not in text and "Chapter 5 shows how the gain moves" in text
    assert findings.RUNG_WORDS["+MLP2x"] == "the 2× MLP"


def test_the_lessons_say_which_runs_the_strongest_baselines_ratio_leaves_out(store):
    old = [r for i in range(2) for r in baselines_run(f"o{i}", f"m{i}", fast(fasttransformer__engine__default=4.0,
                                                                              fasttransformer__compile_ro__fused=5.0))]
    store(old + _graphed_run("n0", "m2", engine=4.0, graphed=4.5))
    assert ("1.12× faster than the strongest compiled step of the run (the first two over the 3 runs on 3 machine "
            "starts that measured the current engine, the last over the 1 run on 1 machine start among them that "
            "measured every configuration that was the strongest in some run)") in findings.lessons("h200")


def test_a_baseline_that_moves_between_runs_is_said_beside_the_engine_ratio(store):
    store(_three_runs())  # the strongest compiled step took 4, 6 and 5 ms in the three runs
    text = ef.moving_baseline("h200")
    assert text is not None and "The strongest baseline itself moves from run to run" in text
    assert "FastTransformer bf16 5.000 (4.000–6.000) ms over 3 runs" in text
    assert text in findings.additions("h200")
    same = [r for i in range(3) for r in baselines_run(f"s{i}", f"m{i % 2}",
                                                       fast(fasttransformer__compile_ro__fused=5.0))]
    store(same)
    assert ef.moving_baseline("h200") is None
    assert not any("moves from run to run" in a for a in findings.additions("h200"))


def test_the_speedrun_sentence_gives_the_same_call_race_where_stored(store, tmp_path):
    from ftlib.harness.studies import HEAD_TO_HEAD

    def run(model: str, seed: int, t: float) -> dict:
        return {"device_slug": "h200", "key": f"{model} {seed}", "model": model, "seed": seed, "status": "ok",
                "target": 1.5, "history": [{"step": 0, "time_s": 0.0, "val_loss": 4.0},
                                           {"step": 10, "time_s": t, "val_loss": 1.49}],
                "steps_to_target": 10, "time_to_target_excl_startup_s": t, "startup_s": 1.0}

    store([])
    assert findings._speedrun("h200") is None  # nothing stored: no sentence
    rows = [run(HEAD_TO_HEAD[0], s, 12.0) for s in range(3)] + [run(HEAD_TO_HEAD[1], s, 2.0) for s in range(3)]
    (tmp_path / "results" / "h200" / "speedrun-head-to-head.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows))
    text = findings._speedrun("h200")
    assert "alternating, in one process, the speedrun's leader takes 2.00 s against 12.00 s: 6.00×" in text
    assert text.endswith("follow the host's CPU from one machine to another (chapter 8).")
    assert "3/3 of its runs" in text
    assert "(compilation and warm-up apart): run against nanoGPT's recipe" in text  # no leaderboard before it


def test_what_is_not_measured_is_listed_until_its_rows_are_stored(store, tmp_path):
    store([])
    gaps = findings.unmeasured("h200")
    assert any("ceilings" in g for g in gaps) and any("profiles of chapter 1" in g for g in gaps)
    assert "No Tesla T4 rows are stored" in findings.unmeasured_markdown("h200")
    ceiling = {"key": "ceiling copy", "op": "ceiling", "variant": "copy", "status": "ok", "device_slug": "h200"}
    (tmp_path / "results" / "h200" / "kernels.jsonl").write_text(json.dumps(ceiling) + "\n")
    assert not any("ceilings" in g for g in findings.unmeasured("h200"))
    assert any("attention kernel against SDPA" in g for g in findings.unmeasured("h200"))  # a ceiling is not one
    assert any(g.endswith("chapter 1 (phases, kernel categories, the SDPA backend from a trace)") for g in gaps)
    # The post's precision and the chapters' own suites count too: a GPU without them is said to lack them.
    assert any(g.startswith("the baselines suite in fp32, the post's precision") for g in gaps)
    assert any(g.startswith("the sequence-length sweep (chapter 5)") for g in gaps)
    (tmp_path / "results" / "h100").mkdir()
    (tmp_path / "results" / "h100" / "profile.jsonl").write_text(json.dumps({"status": "ok", "key": "p"}) + "\n")
    assert any(g.endswith("chapter 1 (phases, kernel categories, the SDPA backend from a trace): measured on the H100 "
                          "only, whose rows the chapter shows") for g in findings.unmeasured("h200"))
    (tmp_path / "results" / "t4").mkdir()
    (tmp_path / "results" / "t4" / "baselines.jsonl").write_text("")
    assert "Tesla T4" not in findings.unmeasured_markdown("h200")
    assert findings.unmeasured_markdown("h200") in findings.markdown("h200")
    # every gap but one filled: a list of one item
    for bench in ("kernels", "speedrun-head-to-head", "ddp", "baselines", "tsweep", "compile_time", "grid",
                  "convergence", "speedrun"):
        with open(tmp_path / "results" / "h200" / f"{bench}.jsonl", "a") as f:
            f.write(json.dumps({"status": "ok", "key": bench, "op": "attention", "precision": "fp32"}) + "\n")
    assert findings.unmeasured("h200") == [
        "the measured profiles of chapter 1 (phases, kernel categories, the SDPA backend from a trace): measured on "
        "the H100 only, whose rows the chapter shows"]
    assert "stand:\n\n- the measured profiles" in findings.unmeasured_markdown("h200")
    # A reader's own CPU rows count for the CPU's list (chapters run with MEASURE on a CPU), never for a GPU's.
    (tmp_path / "results" / "cpu").mkdir()
    (tmp_path / "results" / "cpu" / "profile.jsonl").write_text(json.dumps({"status": "ok", "key": "p"}) + "\n")
    assert not any("profiles of chapter 1" in g for g in findings.unmeasured("cpu"))
    assert "the CPU" not in " ".join(findings.unmeasured("h200"))


def test_runs_without_a_configuration_that_won_elsewhere_are_said_to_be_left_out(store):
    old = [r for i in range(2) for r in baselines_run(f"o{i}", f"m{i}", fast(fasttransformer__compile_ro__fused=5.0))]
    new = _graphed_run("n0", "m2", engine=10.0, graphed=1.5)
    store(old + new)
    assert ("Left out of the engine's ratios, for lacking a configuration that was the strongest baseline in "
            "other runs: FastTransformer bf16, 2 runs without manual CUDA graph of the compiled step.") \
        in findings.additions("h200")
    store(old)
    assert not any(a.startswith("Left out") for a in findings.additions("h200"))


def test_another_device_gets_its_own_table_and_the_headline_device_is_said_to_lack_its_winner(store):
    store(_three_runs())
    before = _ft_bf16()
    h100 = [r for i in range(3) for r in _graphed_run(f"g{i}", f"n{i % 2}", engine=3.0, graphed=4.0)]
    store(_on("h100-80gb-hbm3", "NVIDIA H100 80GB HBM3", h100), "h100-80gb-hbm3")
    assert ef.other_devices("h200") == ["h100-80gb-hbm3"] and ef.other_devices("h100-80gb-hbm3") == ["h200"]
    assert _ft_bf16() == before  # never pooled: the h200's line is its runs' alone
    other = _ft_bf16("h100-80gb-hbm3")
    assert (other["engine speed-up"], other["strongest baseline of the same run"], other["runs"]) == (
        "1.33×", "manual CUDA graph of the compiled step", "3 runs on 2 machine starts")
    text = findings.markdown("h200")
    intro = "On the NVIDIA H100 80GB HBM3, in its own runs (never pooled with the H200's), the same comparison:"
    assert intro in text and text.index(intro) > text.index("| FastTransformer | bf16 | 4.000 |")
    assert "| FastTransformer | bf16 | 3.000 | manual CUDA graph of the compiled step | 4.000 | 1.33× |" in text
    lack = ef.weaker_set("h200")
    assert lack == ("No run on the NVIDIA H200 measured the manual CUDA graph of the compiled step, the strongest "
                    "baseline in 3 of the 6 cases (a model and precision in one run) on the NVIDIA H100 80GB HBM3 "
                    "that measured it: its engine ratios above are against a weaker set of configurations.")
    assert lack in findings.additions("h200")
    assert ef.weaker_set("h200", "its fastest is of a smaller set").endswith("that measured it: its fastest is of a "
                                                                          "smaller set.")  # chapter 3's ending
    assert ef.weaker_set("h100-80gb-hbm3") is None  # the H100 measured every configuration the H200's runs did
    # A winner elsewhere that the headline device's runs did measure leaves nothing to say.
    store(_on("h200", "NVIDIA H200", [r for i in range(3) for r in _graphed_run(f"h{i}", f"m{i % 2}", 4.0, 4.5)]))
    assert ef.weaker_set("h200") is None


def test_the_compiler_ceiling_claim_is_headlined_in_every_precision_measured(store):
    """The post's premise (fp32 on a T4) is answered differently by precision: the headline shows each precision
    the runs measured, fp32 first, not fp32 alone (a GPU without fp32 runs would otherwise show none)."""
    store(_three_runs())  # bf16 runs only
    claims = [c for c in findings.findings_table("h200")["the post's claim"] if "hand-written" in c]
    assert claims == ["A hand-written GPT-2 engine cannot beat torch.compile (bf16)"]


def test_the_launch_lesson_reads_a_gpu_in_the_precision_it_has(store):
    """A GPU whose runs measured fp16 alone is read in fp16, the last of chapter 3's order, not left without
    the lesson's numbers."""
    import dataclasses

    from synthetic_results import BASELINE_CASES

    store(baselines_run("r1", "m1", {}, cases=[dataclasses.replace(c, precision="fp16") for c in BASELINE_CASES]))
    assert "GPT-2 (fp16, H200): eager 10.00 ms; one CUDA graph of the whole step 10.00 ms" in findings.lessons("h200")


def test_a_slow_compiled_step_in_the_engines_runs_is_said_with_the_all_runs_median(store):
    """The current engine ran in one run whose strongest compiled step (6 ms) was slower than that step's median
    over every run here (4 ms): the same-run ratio (3×) also measures that run's host, and the notes say so,
    with the engine against the all-runs median for scale (2×)."""
    def ms(engine: float, compiled: float) -> dict:
        return fast(fasttransformer__engine__default=engine, fasttransformer__compile_ro__fused=compiled)

    store(baselines_run("r1", "m1", ms(2.0, 4.0), bad=OLDER) + baselines_run("r2", "m2", ms(2.0, 4.0), bad=OLDER)
          + baselines_run("r3", "m3", ms(2.0, 6.0)))
    (note,) = [n for n in ef.engine_notes("h200") if "slow compiled step" in n]
    assert ("FastTransformer bf16: the 1 run behind its engine ratio had a strongest compiled step of 6.00 ms, "
            "against 4.00 ms over all 3 runs here; against that, the engine's 2.00 ms is 2.00×") in note
    # A run whose compiled step is typical adds nothing.
    store(baselines_run("r1", "m1", ms(2.0, 4.0), bad=OLDER) + baselines_run("r3", "m3", ms(2.0, 4.1)))
    assert not [n for n in ef.engine_notes("h200") if "slow compiled step" in n]
