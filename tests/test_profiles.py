"""The chapters' measuring profiles: what SMOKE=True, 't4' and False measure, on which device, for how long.

The T4 profile must measure the post's models at full size in the precisions the device runs, and fit
in about ten minutes a chapter on a T4 (the estimate, at most :data:`LIMIT_S`); SMOKE=True must keep
measuring what it always measured; rows of the T4 profile go where full-size rows go, under the keys
the suites give them.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ftlib.analysis.peaks import lookup
from ftlib.core.device import DeviceInfo
from ftlib.harness import plans, profiles
from ftlib.harness import suites as suites_mod
from ftlib.harness.bench.cases import make_cases
from ftlib.harness.plans import chapter_plan, device_peaks, plan_here, run_plan
from ftlib.harness.profiles import (
    MEASURING_CHAPTERS,
    Baselines,
    Kernels,
    Profiles,
    Steps,
    Training,
    checkpoint_smoke,
    normalise_smoke,
    part,
    rows_device,
    view_smoke,
)
from ftlib.harness.results import my_results_dir, results_dir
from ftlib.harness.studies import SUITE_ORDER
from ftlib.harness.suites import SMOKE_ROOT, SUITES, baselines, smoke_cases
from ftlib.model.ablations import grid
from ftlib.model.config import preset

LIMIT_S = 12 * 60  # a chapter's T4 profile on a T4: about ten minutes, never more than twelve
T4 = DeviceInfo.for_capability("7.5")
H100 = DeviceInfo.for_capability("9.0")
CPU = DeviceInfo.cpu()


def keys(cases, bench: str) -> list[str]:
    return [c.key(bench) for c in cases]


# -- SMOKE's values ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [True, "t4", False])
def test_the_three_values_pass(value):
    assert normalise_smoke(value) is value


@pytest.mark.parametrize("value", ["T4", "true", 1, 0, None, "smoke", ""])
def test_anything_else_is_refused_with_the_allowed_values(value):
    with pytest.raises(ValueError, match=r"True .*'t4'.* False"):
        normalise_smoke(value)
    with pytest.raises(ValueError):
        chapter_plan("03", value, T4)


def test_unknown_chapters_and_parts_are_refused():
    with pytest.raises(ValueError, match="measuring chapters"):
        profiles.profile("02", True)
    with pytest.raises(ValueError, match="no 'grid'"):
        part("05", "t4", "grid")


@pytest.mark.parametrize("make, message", [
    (lambda: Steps("grid", "grid", ((32, 256),), ("warp",)), "modes"),
    (lambda: Steps("grid", "grid", ((32, 256),), ("eager",), precisions=("fp8",)), "precisions"),
    (lambda: Steps("grid", "grid", ((32, 0),), ("eager",)), "shape"),
    (lambda: Steps("grid", "grid", ((32, 256),), ("eager",), cells=("XYZ",)), "cells"),
    (lambda: Steps("grid", "layers", ((32, 256),), ("eager",)), "models"),
    (lambda: Steps("grid", "grid", ((32, 256),), ("eager",), iters=-1), "iters"),
    (lambda: Baselines(configs=(("eager", "whole-step"),)), "STEP_CONFIGS"),
    (lambda: Baselines(("fp32",), smoke=True), "smoke"),
    (lambda: Profiles((32, 256), ("fp32",), steps=1, warmup=1, timing_steps=0), "timing_steps"),
    (lambda: Profiles((32, 256), ("fp32",), 1, 1, 1, modes=("engine",)), "modes"),
    (lambda: Training(("convergence-fast",), tiny=False), "suites"),
    (lambda: Training(("convergence",), tiny=False, budget_s=0), "budget_s"),
    (lambda: Kernels(()), "ops"),
])
def test_a_profile_that_makes_no_sense_is_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# -- the T4 profile ---------------------------------------------------------------------------------

@pytest.mark.parametrize("chapter", MEASURING_CHAPTERS)
def test_t4_plans_build_for_a_t4_without_tf32_or_bf16(chapter):
    plan = chapter_plan(chapter, "t4", T4)
    assert plan.count > 0
    cases = [c for p in plan.parts for c in p.cases]
    assert not {c.precision for c in cases} & {"tf32", "bf16"}
    for c in cases:  # the post's models at full size, at its 8,192 tokens per step
        assert (c.config.n_layer, c.config.n_embd, c.B * c.T) == (6, 256, 8192), c


def test_t4_plans_keep_what_an_sm90_runs():
    precisions = {c.precision for ch in MEASURING_CHAPTERS for p in chapter_plan(ch, "t4", H100).parts
                  for c in p.cases}
    assert {"fp32", "fp16", "tf32", "bf16"} <= precisions  # chapter 1 profiles every precision it runs
    assert {c.precision for c in chapter_plan("01", "t4", T4).part("profile").cases} == {"fp32", "fp16"}


def test_t4_measures_the_posts_claims_at_full_size():
    sweep = chapter_plan("05", "t4", T4).part("tsweep")
    assert {(c.B, c.T) for c in sweep.cases} == {(64, 128), (32, 256)}
    assert {(c.mode, c.precision) for c in sweep.cases} == {("eager", "fp32"), ("compile-ro", "fp32")}
    assert all(c.config.block_size == c.T for c in sweep.cases)
    compile_time = chapter_plan("05", "t4", T4).part("compile_time")
    assert sorted(c.label for c in compile_time.cases) == ["fasttransformer", "gpt2"]
    assert {c.precision for c in chapter_plan("05", "t4", T4).part("baselines").cases} == {"fp16"}
    cells = {c.label for c in chapter_plan("04", "t4", T4).parts[0].cases}
    assert cells == {"gpt2", "MQA", "SDPA", "MLP2x", "RMS", "MQA+SDPA+MLP2x+RMS"}  # each alone, all together
    training = chapter_plan("08", "t4", T4).part("convergence").spec
    assert training.suites == ("convergence-original",) and not training.tiny
    runs = training.runs()
    assert {r.steps for _, _, r, _ in runs} == {200} and 42 in {seed for *_, seed in runs}


def t4_over_budget(info: DeviceInfo = T4) -> dict[str, float]:
    """The chapters whose T4 profile is estimated over LIMIT_S on ``info`` (minutes), no budget applied."""
    out = {}
    for chapter in MEASURING_CHAPTERS:
        work = chapter_plan(chapter, "t4", info).work_s
        if work > LIMIT_S:
            out[chapter] = work / 60
    return out


def test_every_t4_profile_fits_in_about_ten_minutes_on_a_t4():
    assert device_peaks(T4) is lookup("Tesla T4")
    assert t4_over_budget() == {}
    for chapter in ("01", "03", "04", "05"):  # the estimate counts for something: not a few seconds
        assert chapter_plan(chapter, "t4", T4).work_s > 5 * 60, chapter


@pytest.mark.parametrize("chapter", ["03", "04", "05"])
def test_doubling_a_t4_profile_breaks_the_limit(chapter, monkeypatch):
    parts = profiles.PROFILES[chapter]["t4"]
    monkeypatch.setitem(profiles.PROFILES, chapter, {**profiles.PROFILES[chapter], "t4": parts + parts})
    assert chapter in t4_over_budget()


def test_the_estimate_grows_with_steps_and_the_device():
    gpt2 = preset("gpt2")
    t4_step = plans.step_seconds(gpt2, 32, 256, "fp32", T4)
    assert t4_step > plans.step_seconds(gpt2, 32, 256, "fp32", H100)
    assert t4_step > plans.step_seconds(gpt2, 32, 256, "fp16", T4)
    assert t4_step > 2 * plans.step_seconds(gpt2, 16, 256, "fp32", T4) * 0.9
    unknown = dataclasses.replace(T4, name="Some Future GPU")
    assert device_peaks(unknown).capability == (7, 5)


def test_the_announcement_names_count_device_and_minutes():
    text = chapter_plan("05", "t4", T4).announce()
    first = text.splitlines()[0]
    assert first.startswith("measuring 16 cases on Tesla T4 (sm_75): about ") and " min" in first
    assert "not measured here: tf32" not in text  # chapter 5's T4 parts name no tf32 case
    assert "not measured here: tf32" in chapter_plan("01", "t4", T4).announce()


# -- keys and places --------------------------------------------------------------------------------

@pytest.mark.parametrize("chapter", MEASURING_CHAPTERS)
@pytest.mark.parametrize("info", [T4, H100], ids=["sm75", "sm90"])
def test_t4_rows_are_keyed_as_the_suites_key_them(chapter, info):
    for p in chapter_plan(chapter, "t4", info).parts:
        if p.spec.bench in SUITES:
            want = set(keys(SUITES[p.spec.bench].cases(), p.spec.bench))
            assert set(keys(p.cases, p.spec.bench)) <= want, p.spec.bench


def test_t4_rows_go_where_full_size_rows_go_and_smoke_baselines_stay_apart(monkeypatch, tmp_path):
    monkeypatch.setenv("FTLIB_MY_RESULTS", str(tmp_path / "mine"))
    roots: list[tuple[str, object]] = []

    def fake_bench_cases(cases, store, *args, **kwargs):
        roots.append((store.bench, store.root))
        return []

    monkeypatch.setattr(plans, "bench_cases", fake_bench_cases)
    monkeypatch.setattr(suites_mod, "bench_cases", fake_bench_cases)
    cpu = torch.device("cpu")
    run_plan(chapter_plan("05", "t4", T4, gpu=True), cpu)
    assert [b for b, _ in roots] == ["tsweep", "compile_time", "baselines"]
    assert {r for _, r in roots} == {my_results_dir()} and my_results_dir() != results_dir()
    roots.clear()
    run_plan(chapter_plan("05", True, CPU), cpu)
    assert roots == [("baselines", SMOKE_ROOT), ("tsweep", my_results_dir())]


def test_t4_needs_a_gpu_or_a_rehearsal(monkeypatch):
    monkeypatch.delenv("FTLIB_CAPABILITY", raising=False)
    with pytest.raises(ValueError, match="SMOKE=True"):
        plan_here("04", "t4", torch.device("cpu"))
    monkeypatch.setenv("FTLIB_CAPABILITY", "7.5")
    plan = plan_here("04", "t4", torch.device("cpu"))
    assert plan.device.startswith("Tesla T4 (sm_75), rehearsed on ") and plan.count == 18
    assert plan_here("04", True, torch.device("cpu")).count == 16  # a smoke run keeps the CPU's modes


def test_views_read_the_profiles_sizes_and_devices():
    assert view_smoke("t4", False) is False and view_smoke("t4", True) == "t4"
    assert rows_device(True, True, "t4") == "t4" and rows_device(False, True, "h200") == "h200"
    assert rows_device("t4", True, "t4") is None and rows_device(True, False, "cpu") is None
    assert checkpoint_smoke(True) and checkpoint_smoke("t4") and not checkpoint_smoke(False)
    assert part("05", "t4", "tsweep").tokens == 8192 and part("05", True, "tsweep").tokens == 256
    assert part("04", "t4", "grid").configs().keys() == set(profiles.CLAIM_CELLS)


# -- SMOKE=True and False measure what they always measured ------------------------------------------

SMALL = dict(n_layer=1, n_embd=64)


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu", "cpu"])
def test_smoke_plans_are_the_small_sizes_they_always_were(gpu):
    info = H100 if gpu else CPU
    dev = torch.device("cuda" if gpu else "cpu")
    for chapter in ("03", "05"):
        got = chapter_plan(chapter, True, info).part("baselines")
        assert keys(got.cases, "b") == keys(smoke_cases(baselines(), dev), "b")
    modes = ["eager", "cudagraph"] if gpu else ["eager"]
    g = chapter_plan("04", True, info).part("grid")
    want = make_cases({k: v.replace(**SMALL) for k, v in grid().items()}, [(4, 64)], modes, ["fp32"])
    assert keys(g.cases, "grid") == keys(want, "grid") and g.kwargs == {"warmup": 3, "iters": 10}
    modes = ["eager", "compile-ro"] if gpu else ["eager"]
    want = [c for T in (32, 64) for c in make_cases({m: preset(m, block_size=T, **SMALL)
                                                     for m in ("gpt2", "fasttransformer")},
                                                    [(256 // T, T)], modes, ["fp32"])]
    s = chapter_plan("05", True, info).part("tsweep")
    assert keys(s.cases, "tsweep") == keys(want, "tsweep") and s.kwargs == {"warmup": 3, "iters": 10}
    p = chapter_plan("01", True, info).part("profile")
    assert {(c.B, c.T, c.config.n_layer, c.precision) for c in p.cases} == {(4, 64, 2, "fp32")}
    assert len(p.cases) == (8 if gpu else 2)
    assert (p.spec.steps, p.spec.warmup, p.spec.timing_steps) == (2, 2, 5)
    k = chapter_plan("06", True, info).part("kernels").spec
    assert (k.ops, k.cpu_ops, k.cpu_reps, k.budget_s) == (("ceilings", "rmsnorm", "cross_entropy"), None, 1, None)
    t = chapter_plan("08", True, info).part("convergence").spec
    assert t.suites == SUITE_ORDER and t.tiny and t.budget_s == 600


def test_full_plans_are_the_whole_suites():
    assert keys(chapter_plan("03", False, H100).part("baselines").cases, "b") == keys(baselines(), "b")
    g = chapter_plan("04", False, H100).part("grid")
    assert len(g.cases) == 32 and g.kwargs == {}
    s = chapter_plan("05", False, H100).part("tsweep")
    assert sorted({c.T for c in s.cases}) == list(suites_mod.TSWEEP_T) and s.kwargs == {}
    assert {c.precision for c in chapter_plan("01", False, H100).part("profile").cases} == {"fp32", "tf32", "bf16"}


@pytest.mark.parametrize("chapter", MEASURING_CHAPTERS)
def test_each_measuring_chapter_announces_its_plan_before_measuring(chapter):
    from pathlib import Path

    text = next((Path(__file__).resolve().parent.parent / "book").glob(f"{chapter}_*.py")).read_text()
    plan, announce, run = (text.find(f'plan_here("{chapter}", SMOKE, device)'), text.find("print(plan.announce())"),
                           text.find("run_plan(plan, device)"))
    assert -1 < plan < announce < run, chapter
    assert "MEASURE and SMOKE" not in text and "if SMOKE else" not in text  # sizes come from the profiles


def _profile(preset_name: str, mode: str, fwd: float, bwd: float, gaps: float, gemm: float, other: float) -> dict:
    """A stored profile row as ftlib.harness.profiling writes it (times in us per step)."""
    return {"preset": preset_name, "mode": mode, "precision": "fp32", "B": 32, "T": 256, "device_slug": "h200",
            "step_ms": (fwd + bwd + gaps) / 1e3, "sdpa_backend": "efficient", "phase_source": "trace",
            "phases": [{"phase": "forward", "total_us": fwd}, {"phase": "backward", "total_us": bwd}],
            "gaps_us": gaps, "kernels": [{"category": "matmul", "total_us": gemm, "name": "sgemm", "count": 1,
                                          "phase": "forward"},
                                         {"category": "elementwise", "total_us": other, "name": "add", "count": 1,
                                          "phase": "forward"}]}


def test_chapter1_findings_are_computed_from_the_profiles():
    from ftlib.views import profile as pv

    rows = [_profile("gpt2", "eager", 1000, 2000, 1000, 600, 400),
            _profile("fasttransformer", "eager", 1000, 2500, 1500, 300, 700),
            _profile("gpt2", "cudagraph", 1000, 2000, 0, 900, 100)]
    text = pv.findings(rows)
    assert "**H200, fp32:**" in text
    assert "the backward takes 2.0–2.5× the forward's GPU time over 3 profiles" in text
    # gaps: eager 1000/4000 and 1500/5000 of the step, the graph none
    assert "25%–30% of the step in eager" in text and "0% in cudagraph" in text
    assert "GEMMs are 30%–90% of the kernel time" in text
    assert "cannot answer" in pv.findings([])
