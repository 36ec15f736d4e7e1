"""ftlib.engineview on synthetic rows (tests/synthetic_results.py): tables, verdicts, figures."""

from __future__ import annotations

import pytest
from synthetic_results import ALT_GPT2_TF32_MS, ENGINE_MS, STEP_MS, VARIANT_MS, write_all

from ftlib import engineview
from ftlib.benchview import ok_rows
from ftlib.peaks import lookup, step_floor


@pytest.fixture()
def rows(tmp_path, monkeypatch):
    monkeypatch.setenv("FTLIB_RESULTS_DIR", str(tmp_path / "results"))
    write_all(tmp_path / "results")
    return {b: ok_rows(b) for b in ("engine", "engine_check")} | {"steps": ok_rows(["fig1", "precision"])}


def test_verdicts_follow_the_rows(rows):
    got = {v["target"]: v for v in engineview.verdicts(rows["engine"]) if v["route"] == "engine"}
    assert got["FastTransformer engine >= 1.5x compile-ro, fp32"]["verdict"] == "met"
    assert got["FastTransformer engine >= 1.5x compile-ro, tf32"]["verdict"] == "not met"
    assert got["GPT-2 engine faster than compiled GPT-2, fp32"]["verdict"] == "met"
    assert got["GPT-2 engine faster than compiled GPT-2, tf32"]["verdict"] == "not met"
    ft = ENGINE_MS[("fasttransformer", "fp32")]
    assert got["FastTransformer engine >= 1.5x compile-ro, fp32"]["measured"] == pytest.approx(
        ft["compile-ro"] / ft["engine"])


def test_alternative_routes_get_their_own_verdict(rows):
    alt = [v for v in engineview.verdicts(rows["engine"]) if v["route"] != "engine"]
    assert [(v["target"], v["route"], v["verdict"]) for v in alt] == [
        ("GPT-2 engine faster than compiled GPT-2, tf32", "+flash-attn", "met")]
    assert alt[0]["measured"] == pytest.approx(ENGINE_MS[("gpt2", "tf32")]["compile-ro"] / ALT_GPT2_TF32_MS)


def test_probe_table_groups_kernel_time_by_category(tmp_path, monkeypatch, rows):
    table = engineview.probe_table(ok_rows("engine_probe"))
    assert [t["precision"] for t in table] == ["tf32", "bf16"]
    t = table[0]
    assert (t["matmul"], t["attention"], t["norms"], t["reductions (sums)"], t["optimizer"], t["other"]) == (
        900.0, 250.0, 100.0, 200.0, 20.0, 30.0)
    assert t["largest"] == "matmul" and t["largest share"] == pytest.approx(900 / 1500)
    assert engineview.probe_category("fmha_cutlassB_f32_aligned_64x64") == "attention"
    assert engineview.probe_category("Memcpy DtoD (Device -> Device)") == "copies and casts"


def test_verdicts_without_rows_say_not_measured():
    out = engineview.verdicts([])
    assert len(out) == 4 and {v["verdict"] for v in out} == {"not measured"}
    assert engineview.step_table([], []) == [] and engineview.kernel_deltas([]) == []


def test_step_table_takes_baselines_from_the_engine_run(rows):
    table = engineview.step_table(rows["steps"], rows["engine"])
    get = {(t["model"], t["precision"], t["mode"]): t for t in table}
    # compile-ro and cudagraph from the engine's own run, not chapter 3's (which differ here)
    assert get[("fasttransformer", "fp32", "compile-ro")]["median_ms"] == ENGINE_MS[("fasttransformer", "fp32")][
        "compile-ro"]
    assert get[("fasttransformer", "fp32", "compile-ro")]["source"] == "engine run"
    assert get[("gpt2", "fp32", "eager")]["median_ms"] == STEP_MS[("gpt2", "fp32", "eager")]
    assert get[("gpt2", "fp32", "eager")]["source"] == "fig1/precision"
    assert ("gpt2", "tf32", "compile") not in get  # never measured: left out, not invented
    assert {t["mode"] for t in table} == set(engineview.MODES)
    fig = engineview.figure1(table, "h200")
    assert len(fig.data) == 2 and len(fig.data[0].y) == sum(1 for t in table if t["model"] == "gpt2")


def test_kernel_deltas_are_variant_minus_full_engine(rows):
    d = {(r["model"], r["variant"]): r for r in engineview.kernel_deltas(rows["engine"])}
    full = ENGINE_MS[("fasttransformer", "fp32")]["engine"]
    assert set(d) == {(m, v) for m, vs in VARIANT_MS.items() for v in vs}
    assert d[("fasttransformer", "-rmsnorm")]["delta ms"] == pytest.approx(VARIANT_MS["fasttransformer"]["-rmsnorm"]
                                                                           - full)
    assert d[("gpt2", "+flash-attn")]["delta ms"] < 0  # the fused attention makes GPT-2's engine faster


def test_loss_table_and_figure(rows):
    t = engineview.loss_table(rows["engine_check"])
    assert len(t) == 4 and all(r["ok"] for r in t)
    assert max(r["max rel err"] for r in t if r["precision"] == "fp32") < 1e-5
    fig = engineview.loss_figure(rows["engine_check"], "h200")
    assert len(fig.data) == 12  # 2 precisions x 2 models x (engine, reference, relative difference)
    assert all(len(tr.y) == 100 for tr in fig.data)


def test_headroom_floors_come_from_the_accounting(rows):
    room = {(h["model"], h["precision"]): h for h in engineview.headroom(rows["steps"])}
    assert set(room) == {(m, p) for m in ("gpt2", "fasttransformer") for p in ("fp32", "tf32")}
    h = room[("fasttransformer", "fp32")]
    from ftlib.config import preset

    floor = step_floor(preset("fasttransformer"), 32, 256, lookup("NVIDIA H200"), "fp32")["floor_s"] * 1e3
    assert h["roofline floor ms"] == pytest.approx(floor)
    assert h["compile-ro / floor"] == pytest.approx(STEP_MS[("fasttransformer", "fp32", "compile-ro")] / floor)
    assert room[("fasttransformer", "tf32")]["cudagraph ms"] is None


def test_latest_round_keeps_each_files_newest_engine_round():
    from ftlib.engineview import latest_round

    rows = [{"bench": "engine", "label": "ft", "median_ms": 9.0},
            {"bench": "engine", "label": "ft", "median_ms": 3.0, "extra": {"round": 2}},
            {"bench": "fig1", "label": "ft", "median_ms": 7.0}]
    kept = latest_round(rows)
    assert [r["median_ms"] for r in kept] == [3.0, 7.0]


def test_rounds_table_pairs_each_round_with_its_own_baseline(rows):
    import copy

    old = []
    for r in rows["engine"]:  # the same rows again as round 1 (no 'round' in extra), 10% slower
        if r["label"] in ("gpt2", "fasttransformer"):
            o = copy.deepcopy(r)
            o["extra"] = {}
            o["median_ms"] *= 1.1 if o["mode"] == "engine" else 1.0
            old.append(o)
    for r in rows["engine"]:
        r.setdefault("extra", {})["round"] = 2
    table = engineview.rounds_table(old + rows["engine"])
    got = {(t["round"], t["model"], t["precision"]): t for t in table}
    ft = ENGINE_MS[("fasttransformer", "fp32")]
    ratio = got[(2, "fasttransformer", "fp32")]["engine over compile-ro"]
    assert ratio == pytest.approx(ft["compile-ro"] / ft["engine"])
    assert got[(1, "fasttransformer", "fp32")]["engine ms"] == pytest.approx(1.1 * ft["engine"])
    assert "kernels swapped in" in got[(1, "gpt2", "tf32")]["changed"]
    assert len(engineview.rounds_figure(table, "h200").data) == 8  # 2 models x 2 precisions x (engine, compile-ro)
