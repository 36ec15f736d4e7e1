"""Chapter 6's closing (ftlib.views.kernel_lessons): our Triton kernels against torch.compile op for op."""

from __future__ import annotations

import pytest

from ftlib.views import kernel_lessons as kl


def _row(variant, impl, us, run, date="2026-12-03", spread=0.5, N=768):
    return {"device_slug": "h200", "op": "bias_grad", "shape": {"M": 8192, "N": N}, "dtype": "fp32",
            "variant": variant, "impl": impl, "timing": "graph", "status": "ok", "median_us": us,
            "p20_us": us - spread, "p80_us": us + spread, "run_id": run, "date": date}


def test_triton_against_compile_takes_both_from_the_newest_run_that_timed_both():
    rows = [_row("v2 torch.compile", "compile", 10.0, "r1"), _row("v3 triton column sum", "triton", 12.0, "r1"),
            # a newer run of Triton alone (named as stored, without "triton"): not set against r1's compile
            _row("v4 column sum 64x64, 4/SM", "pytorch", 8.0, "r2", date="2026-12-04")]
    (d,) = kl.triton_vs_compile.rows(rows)
    assert d["run"] == "r1" and d["triton variant"] == "v3 triton column sum"
    assert d["compile / triton"] == pytest.approx(10.0 / 12.0) and d["outcome"] == "compile faster"


def test_the_closing_tally_splits_the_gemm_kernels_from_the_others():
    """Where the cases mix our GEMM kernels with the others (most of a GPU's cases can be weight-gradient shapes),
    the tally says how each kind fared; one kind alone needs no split."""
    table = [{"op": "rmsnorm", "outcome": "Triton faster"}, {"op": "attention", "outcome": "tie"},
             {"op": "wgrad", "outcome": "compile faster"}, {"op": "wgrad", "outcome": "Triton faster"},
             {"op": "head_loss", "outcome": "compile faster"}]
    assert kl._tally_split(table) == " (1 of 3 among the GEMM kernels, 1 of 2 among the others)"
    assert kl._tally_split(table[:2]) == "" and kl._tally_split(table[2:]) == ""


def test_overlapping_spreads_tie_and_a_case_without_a_shared_run_has_no_ratio():
    rows = [_row("v2 torch.compile", "compile", 10.0, "r1", spread=1.0, N=256),
            _row("v3 triton column sum", "triton", 10.5, "r1", spread=1.0, N=256),
            _row("v2 torch.compile", "compile", 10.0, "r1"), _row("v4 column sum 64x64, 4/SM", "pytorch", 8.0, "r2")]
    got = {d["case"]: d for d in kl.triton_vs_compile.rows(rows)}
    assert got["(8192, 256) fp32"]["outcome"] == "tie" and got["(8192, 256) fp32"]["run"] == "r1"
    assert "(8192, 768) fp32" not in got  # compile in r1, Triton in r2 only: never set against each other
    (line,) = kl.kernel_lines(rows)
    assert "1 case: Triton faster in 0, tied in 1, compile faster in 0" in line


def test_the_closing_names_the_baseline_and_runs_beside_every_engine_ratio(tmp_path, monkeypatch):
    from synthetic_results import write_all

    from ftlib.views import engine as ev
    from ftlib.views.bench import ok_rows
    from ftlib.views.kernels import kernel_rows

    monkeypatch.setenv("FTLIB_RESULTS_DIR", str(tmp_path / "results"))
    write_all(tmp_path / "results")
    text = kl.closing(kernel_rows(), ok_rows("engine"), ev.latest_probes(ok_rows("engine_probe")),
                      ok_rows("engine_candidates"), ["h200"])
    assert "Op for op, in isolation, our Triton kernels are faster than torch.compile's" in text
    engine_lines = [line for line in text.splitlines() if line.startswith("- FastTransformer bf16 (")]
    assert engine_lines and all(" against compile " in line and " machine start" in line for line in engine_lines)
    assert "switching off all of our kernels together (no-kernels) changes the step by FastTransformer fp32" in text


def test_the_engine_sentence_keeps_cases_without_a_verdict_apart():
    both = kl._engine_sentence(["GPT-2 bf16"], ["FastTransformer tf32", "GPT-2 tf32"])
    assert both.endswith("is faster for GPT-2 bf16; on too few runs for a verdict, its median is faster for "
                         "FastTransformer tf32, GPT-2 tf32:\n")
    assert kl._engine_sentence([], ["GPT-2 tf32"]).endswith(
        "has too few runs for a verdict; its median is faster for GPT-2 tf32:\n")
    assert kl._engine_sentence([], []).endswith("is faster for no case:\n")
    assert "(too few runs)" not in both


def test_a_profiled_variant_is_set_against_the_default_engine_in_words():
    """The closing's kernel counts: a variant of the default engine, named by what it changes in words (never
    by option keys, and never called 'one option' where its name lists several), against the default case."""
    from ftlib.model.config import preset

    def probe(label, n, us):
        return {"bench": "engine_probe", "status": "ok", "label": label, "preset": "gpt2", "precision": "bf16",
                "B": 32, "T": 256, "config": preset("gpt2").to_dict(), "device": "NVIDIA H200", "device_slug": "h200",
                "date": "2026-01-01T00:00:00Z", "step_median_us": us,
                "kernels": [{"name": "nvjet_sm90_tst_128x128", "count": n, "us": us / 2}]}

    lines = kl._kernel_count_lines([probe("gpt2", 100, 2000.0),
                                    probe("gpt2 bias_into_buffer=False bf16_bias_weights=False "
                                          "branch_bias_into_norm=False first_norm_into_buffer=False", 202, 2100.0)],
                                   "h200")
    assert lines[0] == ("profiled as a variant of the default engine, GPT-2 bf16, without the bias and first-norm "
                        "options: +102 kernels per step, +100 µs per captured step")


def test_an_ablation_that_ran_the_default_step_is_left_out_said_so():
    def row(label, ms, prec, kernels, off=()):
        return {"device_slug": "h200", "label": label, "preset": "fasttransformer", "precision": prec,
                "mode": "engine", "median_ms": ms, "p20_ms": ms - 0.01, "p80_ms": ms + 0.01, "B": 32, "T": 256,
                "run_id": "r1", "date": "2026-01-01", "commit": "c1",
                "engine": {"kernels": list(kernels), "requested_off": list(off), "notes": {"x": str(off)}}}

    # Strict fp32 keeps SDPA: switching the attention kernel off leaves the step as it was.
    rows = [row("fasttransformer", 5.0, "fp32", ["rmsnorm"]),
            row("fasttransformer -attention", 4.99, "fp32", ["rmsnorm"], ["attention"]),
            row("fasttransformer", 2.0, "tf32", ["rmsnorm", "attention"]),
            row("fasttransformer -attention", 3.0, "tf32", ["rmsnorm"], ["attention"])]
    (line,) = [x for x in kl._ablation_lines(rows, "h200") if "(-attention)" in x]
    assert line.startswith("switching off the fused attention kernel (-attention) changes the step by "
                           "FastTransformer tf32 +1.00 ms (+50%) (left out: FastTransformer fp32, whose engine did "
                           "not run it, so nothing was switched off)")
    # A row that does not describe its engine is kept: nothing says it ran the default's step.
    for r in rows:
        r.pop("engine")
    (line,) = [x for x in kl._ablation_lines(rows, "h200") if "(-attention)" in x]
    assert "fp32 -0.01 ms" in line and "left out" not in line


def test_an_ablation_line_sets_the_step_without_the_piece_against_the_compiled_step_and_names_untimed_cases():
    """Switching the attention kernel off takes the tf32 step back to the compiled step's time: the line says so
    beside the delta, so that a reader sees which piece holds the engine's lead; a default engine of the run
    that had no such case (bf16) is named, not passed over."""
    def row(label, ms, prec):
        return {"device_slug": "h200", "label": label, "preset": "fasttransformer", "precision": prec,
                "mode": "engine", "median_ms": ms, "p20_ms": ms - 0.01, "p80_ms": ms + 0.01, "B": 32, "T": 256,
                "run_id": "r1", "date": "2026-01-01", "commit": "c1"}

    rows = [row("fasttransformer", 2.0, "tf32"), row("fasttransformer -attention", 3.8, "tf32"),
            row("fasttransformer", 1.2, "bf16"), row("fasttransformer -rmsnorm", 1.3, "bf16")]
    (line,) = [x for x in kl._ablation_lines(rows, "h200", {("FastTransformer", "tf32"): 3.82})
               if "(-attention)" in x]
    assert "FastTransformer tf32 +1.80 ms (+90%; 3.80 ms against the compiled step's 3.82 ms)" in line
    assert "(not timed in FastTransformer bf16, whose run had no such case)" in line
    (line,) = [x for x in kl._ablation_lines(rows, "h200") if "(-attention)" in x]
    assert "+1.80 ms (+90%)" in line  # no compiled step known: the delta alone
    # The norm kernel's line, and a first line that names both runs the ablations came from.
    for r in rows[2:]:
        r["run_id"] = "r2"
    lines = kl._ablation_lines(rows, "h200")
    assert lines[0].endswith("(the engine's ablations, from 2 runs, each against the default engine of its own run; "
                             "the notes under the table of what each kernel buys name which)")
    assert any(x.startswith("switching off the RMSNorm kernel (and with it the residual adds") for x in lines)


def test_the_lead_holder_is_the_piece_whose_loss_slows_the_current_engine_most():
    """Per model and precision of the current engine's ablations, the piece without which the step is slowest,
    beside the compiled step; an ablation of an earlier engine, or a case with no compiled step, says nothing."""
    import dataclasses

    from ftlib.training.engine.options import EngineOptions
    from ftlib.views.engine_config import TRIAL_WINNERS

    today = {n: v for n, v in dataclasses.asdict(EngineOptions()).items() if n in TRIAL_WINNERS}

    def row(label, ms, prec):
        return {"device_slug": "h200", "label": label, "preset": "fasttransformer", "precision": prec,
                "mode": "engine", "median_ms": ms, "p20_ms": ms - 0.01, "p80_ms": ms + 0.01, "B": 32, "T": 256,
                "run_id": "r1", "date": "2026-01-01", "commit": "c1",
                "engine": {**today, "kernels": ["rmsnorm"] if label == "fasttransformer" else []}}  # a variant's differ

    rows = [row("fasttransformer", 1.2, "bf16"), row("fasttransformer -rmsnorm", 2.9, "bf16"),
            row("fasttransformer -attention", 1.5, "bf16"), row("fasttransformer uncaptured", 30.0, "bf16"),
            row("fasttransformer", 2.0, "tf32"), row("fasttransformer -attention", 3.8, "tf32")]
    text = kl.lead_holder(rows, "h200", {("FastTransformer", "bf16"): 1.76})
    assert text.endswith("engine table above: FastTransformer bf16, the fused RMSNorm kernel: 2.90 ms without it, "
                         "against 1.76 ms.")  # not the graph (uncaptured), and tf32 has no compiled step here
    assert kl.lead_holder(rows, "h200", {}) is None
    earlier = [{**r, "engine": {**today, "grad_into_buffer": False}} for r in rows]  # an earlier engine's
    assert kl.lead_holder(earlier, "h200", {("FastTransformer", "bf16"): 1.76}) is None
