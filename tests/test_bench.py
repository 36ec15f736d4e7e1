"""CPU tests of the step benchmark and the result store, at tiny sizes."""

from __future__ import annotations

import json
import os

import pytest
import torch

import ftlib.harness.bench.runners as runners
import ftlib.harness.bench.step as bench
from ftlib.core.precision import precision_region as precision
from ftlib.core.timing import summarize_ms
from ftlib.harness.bench.cases import bench_sweep
from ftlib.harness.bench.isolated import bench_step_isolated
from ftlib.harness.bench.step import ROW_FIELDS, bench_step
from ftlib.harness.results import ResultStore, load_rows, results_dir, row_key
from ftlib.model.config import preset

TINY = dict(n_layer=1, n_embd=32, n_head=4, block_size=8)
B, T = 2, 8
FAST = dict(warmup=2, iters=5)


@pytest.fixture
def tiny_ft():
    return preset("fasttransformer", **TINY)


@pytest.fixture
def tiny_gpt2():
    return preset("gpt2", n_kv_head=4, **TINY)


pytestmark = pytest.mark.usefixtures("results_root")  # results under tmp_path (conftest)


def test_row_has_all_fields(tiny_ft):
    row = bench_step(tiny_ft, B, T, "eager", "fp32", "cpu", **FAST)
    missing = [f for f in ROW_FIELDS if f not in row]
    assert not missing
    assert row["status"] == "ok" and row["error"] is None
    assert row["tokens"] == B * T and row["n_iters"] == 5 and row["timing"] == "perf-counter"
    assert row["min_ms"] <= row["p20_ms"] <= row["median_ms"] <= row["p80_ms"] <= row["max_ms"]
    assert row["tokens_per_s"] == pytest.approx(B * T / (row["median_ms"] / 1e3))
    assert row["check_ok"] and row["loss_finite"] and row["first_step_s"] > 0
    assert row["config_hash"] == tiny_ft.config_hash() and row["config"] == tiny_ft.to_dict()
    assert row["key"] == row_key("step", tiny_ft.config_hash(), B, T, "eager", "fp32", {"optimizer": "default"})
    json.dumps(row)  # a row is plain JSON


def test_preset_name_recorded():
    row = bench_step("fasttransformer", 1, 4, "eager", "fp32", "cpu", warmup=2, iters=2)
    assert row["preset"] == "fasttransformer" and row["label"] == "fasttransformer"


def test_cudagraph_on_cpu_is_unsupported_row(tiny_ft):
    row = bench_step(tiny_ft, B, T, "cudagraph", "fp32", "cpu", **FAST)
    assert row["status"] == "unsupported" and "CUDA" in row["error"] and row["median_ms"] is None


def test_bf16_eager_runs(tiny_ft):
    row = bench_step(tiny_ft, B, T, "eager", "bf16", "cpu", **FAST)
    assert row["status"] == "ok" and row["loss_finite"]


def test_failure_becomes_a_row(tiny_ft, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("provoked failure for an absurd batch")

    monkeypatch.setattr(runners, "train_step", boom)
    row = bench_step(tiny_ft, B, T, "eager", "fp32", "cpu", **FAST)
    assert row["status"] == "error" and "provoked failure" in row["error"] and row["median_ms"] is None
    assert "RuntimeError" in row["traceback"]


def test_absurd_batch_is_an_oom_row(tiny_ft):
    row = bench_step(tiny_ft, 10**12, T, "eager", "fp32", "cpu", **FAST)  # 64 TB of token ids
    assert row["status"] == "oom" and row["median_ms"] is None


def test_oom_is_classified(tiny_ft, monkeypatch):
    def oom(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 PiB")

    monkeypatch.setattr(runners, "train_step", oom)
    assert bench_step(tiny_ft, B, T, "eager", "fp32", "cpu", **FAST)["status"] == "oom"


def test_too_long_sequence_is_an_error_row(tiny_ft):
    row = bench_step(tiny_ft, B, 2 * T, "eager", "fp32", "cpu", **FAST)
    assert row["status"] == "error" and "block_size" in row["error"]


def test_sweep_is_resumable(tiny_ft, tiny_gpt2, results_root):
    store = ResultStore("smoke", "cpu")
    args = ({"ft": tiny_ft, "gpt2": tiny_gpt2}, [(B, T)], ["eager", "cudagraph"], ["fp32", "tf32"])
    first = bench_sweep(*args, store=store, progress=False, device="cpu", **FAST)
    assert len(first) == 8 and len(store.rows()) == 8
    assert {r["status"] for r in first} == {"ok", "unsupported"}
    assert store.path == results_root / "cpu" / "smoke.jsonl"
    again = bench_sweep(*args, store=store, progress=False, device="cpu", **FAST)
    assert again == [] and len(store.rows()) == 8


def test_sweep_retries_errors_only(tiny_ft, monkeypatch):
    store = ResultStore("retry", "cpu")
    real = runners.train_step
    monkeypatch.setattr(runners, "train_step", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("flaky")))
    rows = bench_sweep([tiny_ft], [(B, T)], ["eager"], ["fp32"], store=store, progress=False, device="cpu", **FAST)
    assert rows[0]["status"] == "error"
    monkeypatch.setattr(runners, "train_step", real)
    rows = bench_sweep([tiny_ft], [(B, T)], ["eager"], ["fp32"], store=store, progress=False, device="cpu", **FAST)
    assert len(rows) == 1 and rows[0]["status"] == "ok"
    assert [r["status"] for r in store.latest().values()] == ["ok"]  # the retry supersedes the error


def test_sweep_stops_at_deadline(tiny_ft):
    import time

    store = ResultStore("late", "cpu")
    rows = bench_sweep([tiny_ft], [(B, T)], ["eager"], ["fp32"], store=store, progress=False, device="cpu",
                       deadline=time.monotonic() + 1.0, **FAST)  # eager's expected cost is 10 s
    assert rows == [] and store.rows() == []


def test_isolated_run_and_timeout(tiny_ft):
    row = bench_step_isolated(tiny_ft, B, T, "eager", "fp32", "cpu", timeout_s=120, label="ft", **FAST)
    assert row["status"] == "ok" and row["isolated"] and row["first_step_cache"] == "cold-process"
    assert row["key"] == bench_step(tiny_ft, B, T, "eager", "fp32", "cpu", **FAST)["key"]
    late = bench_step_isolated(tiny_ft, B, T, "eager", "fp32", "cpu", timeout_s=0.2, label="ft", **FAST)
    assert late["status"] == "timeout" and late["key"] == row["key"] and late["median_ms"] is None


def test_store_append_is_atomic(tmp_path, monkeypatch):
    store = ResultStore("atomic", "cpu", root=tmp_path)
    store.append({"key": "a", "status": "ok", "median_ms": 1.0})

    def crash(src, dst):
        raise OSError("disk full while replacing")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        store.append({"key": "b", "status": "ok"})
    monkeypatch.undo()
    assert [r["key"] for r in store.rows()] == ["a"]  # the old file is intact
    assert [p.name for p in store.path.parent.iterdir() if p.suffix == ".tmp"] == []  # no temp left
    store.append({"key": "b", "status": "ok", "x": float("nan")})
    assert store.has("b") and store.latest()["b"]["x"] is None  # NaN stored as null: valid JSON


def test_load_rows_skips_cpu_unless_asked(tmp_path):
    for slug in ("h200", "t4", "cpu"):
        ResultStore("fig1", slug, root=tmp_path).append({"key": f"k-{slug}", "status": "ok"})
    assert {r["device_slug"] for r in load_rows("fig1", root=tmp_path)} == {"h200", "t4"}
    assert len(load_rows("fig1", root=tmp_path, include_cpu=True)) == 3
    assert [r["device_slug"] for r in load_rows("fig1", devices=["t4"], root=tmp_path)] == ["t4"]
    assert load_rows("nothing", root=tmp_path) == []


def test_results_dir_follows_env(results_root):
    assert results_dir() == results_root


def test_row_key_depends_on_every_field(tiny_ft):
    base = ("step", tiny_ft.config_hash(), B, T, "eager", "fp32")
    keys = {row_key(*base)}
    for i, alt in enumerate(("other", "deadbeef", 4, 16, "compile", "tf32")):
        changed = list(base)
        changed[i] = alt
        keys.add(row_key(*changed))
    keys.add(row_key(*base, extra={"optimizer": "fused"}))
    assert len(keys) == 8


@pytest.mark.parametrize("mode", ["fp32", "tf32", "bf16"])
def test_precision_context_restores_globals(mode):
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision(), torch.is_autocast_enabled("cpu"))
    with precision(mode, "cpu"):
        pass
    with pytest.raises(ZeroDivisionError), precision(mode, "cpu"):
        _ = 1 / 0
    assert saved == (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                     torch.get_float32_matmul_precision(), torch.is_autocast_enabled("cpu"))


def test_bench_restores_globals(tiny_ft):
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
    bench_step(tiny_ft, B, T, "eager", "tf32", "cpu", **FAST)
    assert saved == (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())


def test_bf16_steps_see_updated_weights():
    """Inside one long precision('bf16') region steps must not reuse stale bf16 casts of the weights."""
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with precision("bf16", torch.device("cpu")):
        y1 = lin(x)
        with torch.no_grad():
            lin.weight.add_(1.0)
        y2 = lin(x)
    assert not torch.equal(y1, y2)


def test_summarize_ms():
    s = summarize_ms([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s["median_ms"], s["min_ms"], s["max_ms"], s["mean_ms"]) == (3.0, 1.0, 5.0, 3.0)
    assert s["p20_ms"] == pytest.approx(1.8) and s["p80_ms"] == pytest.approx(4.2)


@pytest.mark.parametrize("factor", [1.0, 1.01], ids=["agrees", "loss-1pct-off"])
def test_check_ok_is_false_when_a_mode_disagrees_with_eager(tiny_ft, factor, monkeypatch):
    # The engine mode (plain PyTorch ops here: no kernels) is checked against eager training from
    # the same weights and batches; a loss 1% off (the fp32 tolerance is 0.1%) must fail the check.
    from ftlib.training.engine import Engine

    step = Engine.step
    monkeypatch.setattr(Engine, "step", lambda self, x, y: step(self, x, y) * factor)
    row = bench_step(tiny_ft, B, T, "engine", "fp32", "cpu", warmup=2, iters=2, extra={"use_kernels": False})
    assert row["status"] == "ok", row.get("traceback")
    assert row["ref_loss"] is not None and row["check_rtol"] == bench.CHECK_RTOL["fp32"]
    if factor == 1.0:
        assert row["check_ok"] is True and row["check_rel_err"] <= row["check_rtol"]
    else:
        assert row["check_ok"] is False and row["check_rel_err"] == pytest.approx(0.01, rel=1e-3)


def test_an_isolated_case_belongs_to_the_run_that_started_it(tmp_path):
    """Views pair rows within a run: a case measured in a child process must carry its parent's run."""
    from ftlib.harness.bench.isolated import cold_cache_env
    from ftlib.harness.provenance import run_id

    assert cold_cache_env(tmp_path)["FTLIB_RUN_ID"] == run_id()
