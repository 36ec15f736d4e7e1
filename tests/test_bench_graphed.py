"""The 'graphed' placement: the compiled model's whole step captured by hand as one CUDA graph. On a GPU
(FTLIB_TEST_GPU=1) it must compile, capture, agree with the eager step and time; without one it is a row
that says why it did not run."""

from __future__ import annotations

from ftlib.harness.bench.step import bench_step
from ftlib.model.config import preset

TINY = dict(n_layer=2, n_embd=64, n_head=4, block_size=32, vocab_size=128)


def test_the_compiled_step_captured_as_one_graph_runs_and_matches_eager(kernel_device):
    cfg = preset("fasttransformer", **TINY)
    row = bench_step(cfg, 4, 32, "compile", "bf16", kernel_device, optimizer="graphed", warmup=2, iters=5)
    if kernel_device.type != "cuda":
        assert row["status"] == "unsupported" and "needs a CUDA device" in row["error"]
        return
    assert row["status"] == "ok", row.get("error")
    assert row["check_ok"] is True, (row["check_loss"], row["ref_loss"])  # the same loss as the eager step
    assert row["optimizer"] == "adamw-fused-capturable" and row["optimizer_kind"] == "graphed"
    # The warm-up compiled the model (counted before the runner was built) and left no graph break.
    assert row["compiled_graphs"] >= 1 and row["graph_breaks"] == 0
    assert row["median_ms"] > 0 and row["loss_finite"]
