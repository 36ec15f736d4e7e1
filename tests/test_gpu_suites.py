"""The measuring suites (ftlib.harness.suites) and their runner (ftlib.harness.gpu_runner, whose command line
is ci/gpu_bench.py), checked on CPU.

Nothing here measures a full-size case: suites are inspected as case lists, the runner is
driven with a tiny stand-in suite, and the compile-cache handling of ftlib.harness.bench.runners is checked
with torch.compile replaced by the identity.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from pathlib import Path

import pytest
import torch

import ftlib.harness.bench.runners as runners
import ftlib.harness.custom_suites as custom_suites
import ftlib.harness.gpu_runner as gpu_runner
from ftlib.harness import suites
from ftlib.harness.bench.cases import HEADLINE_FIRST, Case
from ftlib.harness.bench.step import bench_step, case_ident
from ftlib.harness.results import ResultStore
from ftlib.harness.suites import SUITES
from ftlib.model.ablations import grid
from ftlib.model.config import preset

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "ci" / "gpu_bench.py")
gpu_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_bench)

TINY = dict(n_layer=1, n_embd=32, n_head=4, block_size=8)


pytestmark = pytest.mark.usefixtures("results_root")  # results under tmp_path (conftest)


def cases(name: str) -> list[Case]:
    return SUITES[name].cases()


@pytest.fixture
def clean_commit(monkeypatch):
    """Rows in these tests come from a clean commit, whatever state this checkout is in."""
    monkeypatch.setattr(gpu_runner, "git_commit", lambda: "0123456789ab")


def test_tsweep_runs_figure5_first_then_tf32_then_eager():
    sweep = cases("tsweep")
    assert len(sweep) == 48
    blocks = [{(c.mode, c.precision) for c in sweep[i:i + 12]} for i in range(0, 48, 12)]
    assert blocks == [{("compile-ro", "fp32")}, {("compile-ro", "tf32")}, {("eager", "fp32")}, {("eager", "tf32")}]
    assert [c.T for c in sweep[:12:2]] == [128, 256, 512, 1024, 2048, 4096]  # T=128 (the claim) first
    for c in sweep:
        assert c.B * c.T == 8192 and c.config == preset(c.label, block_size=c.T)


def test_baselines_measure_every_placement_of_both_models_in_every_precision():
    base = cases("baselines")
    for model in ("gpt2", "fasttransformer"):
        for prec in ("fp32", "tf32", "bf16", "fp16"):
            got = [(c.mode, c.optimizer) for c in base if c.label == model and c.precision == prec]
            want = [c for c in suites.STEP_CONFIGS if not (prec == "fp16" and c[1] == "whole-step")]
            later = [c for c in suites.LATER_STEP_CONFIGS  # appended after the rest
                     if not (prec == "fp16" and c[1] in ("whole-step", "whole-step-ca"))]
            assert got == want + later
            assert {c.config for c in base if c.label == model} == {preset(model)}
    assert {(c.mode, c.optimizer) for c in base} >= {("compile-ro", "whole-step"), ("compile", "fused"),
                                                      ("cudagraph", "fused"), ("engine", "default")}
    broadcast = [c for c in base if c.label == "fasttransformer-broadcast"]
    assert broadcast and {c.precision for c in broadcast} == {"fp32"}
    assert {c.config.kv_layout for c in broadcast} == {"broadcast"}
    assert {(c.B, c.T) for c in base} == {(32, 256)}
    assert base[0].precision == "bf16"  # the headline precision first
    assert len({c.key("baselines") for c in base}) == len(base)  # no two cases share a key


def test_whole_step_needs_a_compile_mode():
    with pytest.raises(ValueError, match="whole-step.*compile mode"):
        Case("gpt2", preset("gpt2"), 2, 8, "eager", "fp32", optimizer="whole-step")
    with pytest.raises(ValueError, match="unknown optimizer"):
        Case("gpt2", preset("gpt2"), 2, 8, "compile", "fp32", optimizer="sgd")
    with pytest.raises(ValueError, match="whole-step"):
        bench_step(preset("fasttransformer", **TINY), 2, 8, "cudagraph", "fp32", "cpu", optimizer="whole-step")


def test_the_graphed_placement_needs_a_compile_mode_without_graphs_of_its_own():
    for mode in ("compile-ro", "cudagraph", "eager"):
        with pytest.raises(ValueError, match=f"captures a compiled step in a CUDA graph.*not '{mode}'"):
            Case("gpt2", preset("gpt2"), 2, 8, mode, "fp32", optimizer="graphed")
    row = bench_step(preset("fasttransformer", **TINY), 2, 8, "compile", "fp32", "cpu", optimizer="graphed")
    assert row["status"] == "unsupported" and "needs a CUDA device" in row["error"]
    # The new configuration came after the others: its cases close the suite, fp16's among them.
    tail = [(c.label, c.precision, c.mode, c.optimizer) for c in cases("baselines")[-8:]]
    assert {x[2:] for x in tail} == {("compile", "graphed")}
    assert {x[1] for x in tail} == {"bf16", "tf32", "fp32", "fp16"}


def test_the_whole_step_with_compiled_autograd_captures_the_backward_and_trains_like_eager():
    """A real compile on the CPU: the backward goes through compiled autograd (its capture counter moves),
    the loss after the first update matches eager's, and the flag is off again afterwards."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    row = bench_step(preset("fasttransformer", **TINY), 2, 8, "compile", "fp32", "cpu", warmup=2, iters=2,
                     optimizer="whole-step-ca", cold_compile=False)
    assert row["status"] == "ok", row.get("error")
    assert row["check_ok"] is True and row["optimizer"] == "adamw-compiled-in-step"
    assert counters["compiled_autograd"]["captures"] >= 1
    assert torch._dynamo.config.compiled_autograd is False
    with pytest.raises(ValueError, match="whole-step-ca.*compile mode"):
        Case("gpt2", preset("gpt2"), 2, 8, "eager", "fp32", optimizer="whole-step-ca")


def test_compile_time_is_at_most_six_isolated_cold_cases():
    ct, opts = cases("compile_time"), SUITES["compile_time"].options
    assert len(ct) <= 6 and {c.mode for c in ct} <= set(opts["isolate_modes"])
    assert opts.get("cold_compile", True) is True  # its first step must be a cold compile
    assert [c.mode for c in ct[:2]] == ["compile-ro", "compile-ro"]  # the post's claim first
    assert {(c.B, c.T, c.precision) for c in ct} == {(32, 256, "fp32")}


def test_grid_compile_and_ladder_compile_every_config_with_shared_caches():
    gc = cases("grid_compile")
    assert [c.config for c in gc] == list(grid().values()) and [c.label for c in gc] == list(grid())
    assert {(c.mode, c.precision, c.B, c.T) for c in gc} == {("compile-ro", "fp32", 32, 256)}
    for name in ("grid_compile", "ladder", "tsweep", "baselines"):
        assert SUITES[name].options["cold_compile"] is False


def test_list_names_the_suites(capsys):
    gpu_bench.main(["list"])
    out = capsys.readouterr().out
    assert "grid_compile   16 cases" in out and "baselines     102 cases" in out and "engine_check" in out


def _tiny_baselines(monkeypatch):
    tiny = [Case("fasttransformer", preset("fasttransformer", **TINY), 2, 8, "eager", "fp32"),
            Case("fasttransformer", preset("fasttransformer", **TINY), 2, 8, "eager", "fp32", optimizer="fused")]
    monkeypatch.setitem(SUITES, "baselines", dataclasses.replace(SUITES["baselines"], make=lambda: tiny))
    return tiny


def _run(out, *extra) -> int:
    return gpu_bench.main(["run", "--only", "baselines", "--device", "cpu", "--out", str(out), "--budget-s", "120",
                           "--warmup", "2", "--iters", "3", *extra])


def test_each_process_is_a_run_of_its_own(tmp_path, monkeypatch, clean_commit):
    """A second process measures the suite again (a repeat) instead of skipping stored keys."""
    tiny = _tiny_baselines(monkeypatch)
    for rid in ("run-a", "run-b"):
        monkeypatch.setattr(gpu_runner, "run_id", lambda rid=rid: rid)
        assert _run(tmp_path / "out") == 0
    stored = ResultStore("baselines", "cpu").rows()
    assert [r["extra"]["run"] for r in stored] == ["run-a", "run-a", "run-b", "run-b"]
    assert len({r["key"] for r in stored}) == 4  # the run is part of the key
    assert {case_ident(r) for r in stored} == {c.ident("baselines") for c in tiny}  # the same two measurements
    assert (tmp_path / "out" / "baselines.jsonl").exists()


def test_rows_record_their_run_and_machine(tmp_path, monkeypatch, clean_commit):
    _tiny_baselines(monkeypatch)
    assert _run(tmp_path / "out") == 0
    for r in ResultStore("baselines", "cpu").rows():
        assert r["run_id"] and r["machine_id"] and r["extra"]["run"] == r["run_id"]
        assert r["optimizer_kind"] in ("default", "fused")


def test_uncommitted_code_is_refused_or_kept_apart(tmp_path, monkeypatch, results_root, capsys):
    _tiny_baselines(monkeypatch)
    monkeypatch.setattr(gpu_runner, "git_commit", lambda: "0123456789ab+dirty")
    assert _run(tmp_path / "out") == 2
    assert "not a clean commit" in capsys.readouterr().err
    assert not (results_root / "cpu" / "baselines.jsonl").exists()
    monkeypatch.setattr(gpu_runner, "UNCOMMITTED_DIR", tmp_path / "uncommitted")
    monkeypatch.setenv("FTLIB_RESULTS_DIR", str(results_root))  # run() redirects it; monkeypatch restores it
    assert _run(tmp_path / "out", "--allow-dirty") == 0
    assert not (results_root / "cpu" / "baselines.jsonl").exists()
    assert len(ResultStore("baselines", "cpu", tmp_path / "uncommitted").rows()) == 2


@pytest.mark.parametrize("argv,message", [
    (["run", "--budget-s", "10"], "at least 60 seconds"),
    (["run", "--iters", "0"], "at least 1"),
])
def test_bad_arguments_are_refused_by_argparse(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        gpu_bench.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["run", "--device", "tpu"], "unknown device 'tpu'"),
    (["run", "--only", "nope"], "known suites: baselines"),
    (["run", "--only", ","], "names no suite"),
])
def test_bad_choices_end_in_a_clear_error(argv, message, capsys):
    assert gpu_bench.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    if "known suites" in message:
        assert all(name in err for name in [*SUITES, *custom_suites.CUSTOM])


def test_an_unreadable_results_file_skips_its_suite_only(tmp_path, monkeypatch, results_root, clean_commit, capsys):
    _tiny_baselines(monkeypatch)
    bad = results_root / "cpu" / "baselines.jsonl"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"key": "a"\n')
    rc = _run(tmp_path / "out")
    out = capsys.readouterr().out
    assert rc == 3 and "[baselines] failed, skipped" in out and "nothing was measured" in out
    assert bad.read_text() == '{"key": "a"\n'  # untouched


def test_profile_suite_traces_the_broadcast_layout_first(monkeypatch):
    import ftlib.harness.profiling

    calls = []
    monkeypatch.setattr(ftlib.harness.profiling, "profile_suite", lambda *a, **k: calls.append((a, k)) or [])
    custom_suites._profile(torch.device("cpu"), time.monotonic() + 1000)
    (names, modes, precs, B, T, _), kw = calls[0]
    assert (names, modes, precs, B, T, kw) == (["fasttransformer"], ["eager"], ["fp32", "tf32"], 32, 256,
                                              {"kv_layout": "broadcast"})
    assert len(calls) > 1 and all(not k for _, k in calls[1:])  # the presets' own profiles follow


@pytest.mark.parametrize("cold,cache", [(True, "fresh-dir"), (False, "shared-dir")])
def test_compile_modes_reset_dynamo_with_or_without_fresh_caches(monkeypatch, cold, cache):
    """Shared caches keep compiled kernels, but Dynamo is still reset around every case.

    Without the reset, the next model of the same class would recompile against the last
    one's guards and, after a few, Dynamo would fall back to eager.
    """
    import torch._dynamo

    resets = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: model)  # no real compile on CPU here
    row = bench_step(preset("fasttransformer", **TINY), 2, 8, "compile", "fp32", "cpu", warmup=2, iters=2,
                     cold_compile=cold)
    assert row["status"] == "ok", row.get("error")
    assert row["first_step_cache"] == cache and len(resets) >= 2
    eager = bench_step(preset("fasttransformer", **TINY), 2, 8, "eager", "fp32", "cpu", warmup=2, iters=2)
    assert eager["first_step_cache"] == "process"
    assert runners.shared_compile_cache is not None


@pytest.mark.parametrize("cc,want,absent", [("7.5", {"fp32", "fp16"}, {"tf32", "bf16"}),
                                             ("9.0", {"fp32", "tf32", "bf16", "fp16"}, set())])
def test_plan_lists_what_a_gpu_would_run_without_one(cc, want, absent, capsys):
    import json

    assert gpu_bench.main(["plan", "--capability", cc, "--json"]) == 0
    cases = json.loads(capsys.readouterr().out)
    assert cases and all({"suite", "mode", "precision"} <= set(c) for c in cases)
    assert {c["precision"] for c in cases} == want and not {c["precision"] for c in cases} & absent
    assert {c["suite"] for c in cases} == {n for n, s in SUITES.items() if s.default}


def test_the_runner_skips_cases_the_device_cannot_honour(tmp_path, monkeypatch, clean_commit, capsys):
    from ftlib.core.device import DeviceInfo

    tiny = [Case("fasttransformer", preset("fasttransformer", **TINY), 2, 8, "eager", p) for p in ("fp32", "tf32")]
    monkeypatch.setitem(SUITES, "baselines", dataclasses.replace(SUITES["baselines"], make=lambda: tiny))
    monkeypatch.setattr(gpu_runner.DeviceInfo, "detect", classmethod(lambda cls, d=None: DeviceInfo.for_capability(
        "7.5")))
    assert _run(tmp_path / "out") == 0
    assert [r["precision"] for r in ResultStore("baselines", "cpu").rows()] == ["fp32"]
    assert "1 cases not run: no TF32 tensor cores" in capsys.readouterr().out


def test_gpu_train_refuses_unknown_suites_and_uncommitted_code(monkeypatch):
    import subprocess
    import sys
    from pathlib import Path

    from ftlib.harness import gpu_runner

    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "ci/gpu_train.py", "--suites", "speedrun,nope"], cwd=root,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "unknown suites nope" in r.stderr
    # What ci/gpu_train.py asks before anything runs: uncommitted code is refused for the training files.
    monkeypatch.setattr(gpu_runner, "git_commit", lambda: "0123456789ab+dirty")
    with pytest.raises(ValueError, match="not a clean commit"):
        gpu_runner.check_provenance(["train"], allow_dirty=False)
    assert "gpu_runner import check_provenance" in (root / "ci" / "gpu_train.py").read_text()


def test_precisions_measures_only_those_cases(tmp_path, monkeypatch, clean_commit):
    """A precision added to a suite later gets runs of its own: ``--precisions`` keeps only its cases."""
    tiny = _tiny_baselines(monkeypatch)
    bf = [dataclasses.replace(c, precision="bf16") for c in tiny]
    monkeypatch.setitem(SUITES, "baselines", dataclasses.replace(SUITES["baselines"], make=lambda: tiny + bf))
    assert gpu_runner.with_precisions(tiny + bf, "bf16") == bf
    assert gpu_runner.with_precisions(tiny + bf, None) == tiny + bf
    assert _run(tmp_path / "out", "--precisions", "fp32") == 0
    assert {r["precision"] for r in ResultStore("baselines", "cpu").rows()} == {"fp32"}


def test_labels_measure_only_those_cases(tmp_path, monkeypatch, clean_commit, capsys):
    """A few cases of a long suite in a run of their own (an ablation beside its default case)."""
    tiny = _tiny_baselines(monkeypatch)
    tiny = [tiny[0], dataclasses.replace(tiny[1], label="fasttransformer fused")]
    monkeypatch.setitem(SUITES, "baselines", dataclasses.replace(SUITES["baselines"], make=lambda: tiny))
    one = tiny[0].label
    assert gpu_runner.with_labels(tiny, one) == [c for c in tiny if c.label == one]
    assert gpu_runner.with_labels(tiny, None) == tiny
    with pytest.raises(ValueError, match="no case is labelled nope"):
        gpu_runner.with_labels(tiny, f"{one},nope")
    assert _run(tmp_path / "out", "--labels", one) == 0
    assert {r["label"] for r in ResultStore("baselines", "cpu").rows()} == {one}
    assert _run(tmp_path / "out", "--labels", "nope") == 2
    assert "no case is labelled nope" in capsys.readouterr().err


def test_precisions_refuses_unknown_names_and_custom_suites(tmp_path, capsys):
    assert _run(tmp_path / "out", "--precisions", "fp8") == 2
    assert "unknown fp8" in capsys.readouterr().err
    assert gpu_bench.main(["run", "--only", "train", "--device", "cpu", "--out", str(tmp_path),
                           "--precisions", "fp16"]) == 2
    assert "case suites only" in capsys.readouterr().err


def test_a_baselines_run_measures_the_engine_and_the_strongest_configurations_first():
    """A run stopped by its budget keeps what a headline ratio divides: per (model, precision), the engine and the
    compiled configurations that have been the strongest come first, the whole group before the next; the run
    measures the suite's cases, no more and no fewer, and the suite's list (the keys' catalogue) keeps its order."""
    suite = SUITES["baselines"]
    listed = suite.cases()
    order = suite.in_measuring_order(listed)
    assert sorted(c.ident("baselines") for c in order) == sorted(c.ident("baselines") for c in listed)
    assert [(c.mode, c.optimizer) for c in listed[:2]] == [("eager", "default"), ("eager", "fused")]  # list kept
    groups = [(c.label, c.precision) for c in order]
    assert all(groups.index(g) == i or groups[i - 1] == g for i, g in enumerate(groups))  # each group in one piece
    first = order[:len(HEADLINE_FIRST)]
    assert {(c.label, c.precision) for c in first} == {("gpt2", "bf16")}
    assert [(c.mode, c.optimizer) for c in first] == list(HEADLINE_FIRST)
    cut = order[:len(order) // 4]  # a run stopped a quarter of the way still pairs the engine with the graphed step
    assert {("engine", "default"), ("compile", "graphed")} <= {(c.mode, c.optimizer) for c in cut}
    assert SUITES["engine"].in_measuring_order(SUITES["engine"].cases()) == SUITES["engine"].cases()


def test_the_runner_measures_in_the_suites_measuring_order(tmp_path, monkeypatch, clean_commit):
    tiny = _tiny_baselines(monkeypatch)
    monkeypatch.setitem(SUITES, "baselines", dataclasses.replace(SUITES["baselines"], make=lambda: tiny,
                                                                 measure_order=lambda cs: cs[::-1]))
    assert _run(tmp_path / "out") == 0
    assert [r["optimizer_kind"] for r in ResultStore("baselines", "cpu").rows()] == ["fused", "default"]
