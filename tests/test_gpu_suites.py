"""The GPU runner's suites (ci/gpu_bench.py) as chapters 4, 5 and 7 need them, checked on CPU.

Nothing here measures a full-size case: suites are inspected as case lists, the runner is
driven with a tiny stand-in suite, and the compile-cache handling of ftlib.bench is checked
with torch.compile replaced by the identity.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
import torch

import ftlib.bench as bench
from ftlib.ablations import grid
from ftlib.bench import Case, bench_step
from ftlib.config import preset
from ftlib.results import ResultStore

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "ci" / "gpu_bench.py")
gpu_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_bench)

TINY = dict(n_layer=1, n_embd=32, n_head=4, block_size=8)


@pytest.fixture(autouse=True)
def results_root(tmp_path, monkeypatch):
    monkeypatch.setenv("FTLIB_RESULTS_DIR", str(tmp_path / "results"))
    return tmp_path / "results"


def cases(name: str) -> list[Case]:
    return gpu_bench.SUITES[name][0]()


def test_tsweep_runs_figure5_first_then_tf32_then_eager():
    sweep = cases("tsweep")
    assert len(sweep) == 48
    blocks = [{(c.mode, c.precision) for c in sweep[i:i + 12]} for i in range(0, 48, 12)]
    assert blocks == [{("compile-ro", "fp32")}, {("compile-ro", "tf32")}, {("eager", "fp32")}, {("eager", "tf32")}]
    assert [c.T for c in sweep[:12:2]] == [128, 256, 512, 1024, 2048, 4096]  # T=128 (the claim) first
    for c in sweep:
        assert c.B * c.T == 8192 and c.config == preset(c.label, block_size=c.T)


def test_fig5_is_tsweeps_first_part_stored_in_tsweep():
    make, opts = gpu_bench.SUITES["fig5"]
    assert opts["store"] == "tsweep" and opts["cold_compile"] is False
    assert [c.key("tsweep") for c in make()] == [c.key("tsweep") for c in cases("tsweep")[:12]]


def test_compile_time_is_at_most_six_isolated_cold_cases():
    ct, opts = cases("compile_time"), gpu_bench.SUITES["compile_time"][1]
    assert len(ct) <= 6 and {c.mode for c in ct} <= set(opts["isolate_modes"])
    assert opts.get("cold_compile", True) is True  # its first step must be a cold compile
    assert [c.mode for c in ct[:2]] == ["compile-ro", "compile-ro"]  # the post's claim first
    assert {(c.B, c.T, c.precision) for c in ct} == {(32, 256, "fp32")}


def test_grid_compile_and_ladder_compile_every_config_with_shared_caches():
    gc = cases("grid_compile")
    assert [c.config for c in gc] == list(grid().values()) and [c.label for c in gc] == list(grid())
    assert {(c.mode, c.precision, c.B, c.T) for c in gc} == {("compile-ro", "fp32", 32, 256)}
    for name in ("grid_compile", "ladder", "tsweep"):
        assert gpu_bench.SUITES[name][1]["cold_compile"] is False


def test_list_names_the_new_suites(capsys):
    gpu_bench.main(["list"])
    out = capsys.readouterr().out
    assert "grid_compile   16 cases" in out and "part of tsweep" in out and "ladder" in out


def test_a_suite_stored_in_another_suites_file(tmp_path, monkeypatch, results_root):
    """fig5's rows land in tsweep.jsonl, so running tsweep afterwards skips them."""
    tiny = [Case("fasttransformer", preset("fasttransformer", **TINY), 2, 8, "eager", "fp32")]
    monkeypatch.setitem(gpu_bench.SUITES, "fig5", (lambda: tiny, {"store": "tsweep", "cold_compile": False}))
    out = tmp_path / "out"
    gpu_bench.main(["run", "--only", "fig5", "--device", "cpu", "--out", str(out), "--budget-s", "120",
                    "--warmup", "2", "--iters", "3"])
    stored = ResultStore("tsweep", "cpu").rows()
    assert len(stored) == 1 and stored[0]["bench"] == "tsweep" and stored[0]["key"] == tiny[0].key("tsweep")
    assert not (results_root / "cpu" / "fig5.jsonl").exists() and (out / "tsweep.jsonl").exists()


def test_profile_suite_traces_the_broadcast_layout_first(monkeypatch):
    import ftlib.profiling

    calls = []
    monkeypatch.setattr(ftlib.profiling, "profile_suite", lambda *a, **k: calls.append((a, k)) or [])
    gpu_bench._profile(torch.device("cpu"), time.monotonic() + 1000)
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
    assert bench._shared_compile_cache is not None
