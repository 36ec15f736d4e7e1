"""CPU tests of data-parallel training: 2 gloo ranks under torchrun, a tiny model.

Each test starts one ``torchrun --standalone --nproc_per_node 2`` (a few seconds of imports per
rank), so the file stays well under a minute on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ftlib.analysis.allreduce import allreduce_volume
from ftlib.harness.ddp_bench import cli_config, ddp_key
from ftlib.harness.distributed import MULTICAST_ENV
from ftlib.harness.results import ResultStore
from ftlib.model.config import preset

ROOT = Path(__file__).resolve().parent.parent
TINY = "n_layer=1,n_embd=32,n_head=4"
B, T = 2, 8


def _torchrun(args: list[str], tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, FTLIB_RESULTS_DIR=str(tmp_path / "results"), OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_allreduce_volume_is_the_ring_formula():
    v = allreduce_volume(preset("gpt2"), 8)
    assert v["n_params"] == 4_837_888 and v["grad_bytes"] == 4 * 4_837_888
    assert v["ring_bytes_per_rank"] == pytest.approx(2 * 7 / 8 * 4 * 4_837_888)
    assert allreduce_volume(1000, 1)["ring_bytes_per_rank"] == 0


def test_cli_config_follows_heads_for_multi_head_presets():
    assert cli_config("gpt2", {"n_head": 4}).n_kv_head == 4
    assert cli_config("fasttransformer", {"n_head": 4}).n_kv_head == 1


def test_cli_writes_a_ddp_row_and_resumes(tmp_path):
    out = tmp_path / "results" / "cpu" / "ddp.jsonl"
    args = ["-m", "ftlib.harness.ddp_bench", "--preset", "fasttransformer", "--override", TINY, "--B", str(B),
            "--T", str(T), "--steps", "4", "--warmup", "2", "--profile-steps", "2", "--device", "cpu",
            "--out", str(out)]
    _torchrun(args, tmp_path)
    rows = ResultStore("ddp", "cpu", tmp_path / "results").rows()
    assert len(rows) == 1  # rank 0 alone writes
    r = rows[0]
    cfg = cli_config("fasttransformer", {"n_layer": 1, "n_embd": 32, "n_head": 4})
    assert r["status"] == "ok", r.get("error")
    assert r["key"] == ddp_key(cfg, B, T, "eager", "fp32", 2)
    assert r["world_size"] == 2 and r["backend"] == "gloo" and r["bench"] == "ddp"
    assert r["B_per_rank"] == B and r["B_global"] == 2 * B and r["tokens"] == 2 * B * T
    assert r["p20_ms"] <= r["median_ms"] <= r["p80_ms"] and r["n_iters"] == 4
    assert r["tokens_per_s"] == pytest.approx(2 * B * T / (r["median_ms"] / 1e3))
    assert len(r["rank_median_ms"]) == 2 and r["loss_finite"]
    assert r["check_ok"] and r["check_rel_err"] < 1e-6
    # accounting beside measurement: the bytes the profiler saw gloo reduce are the fp32 grads
    assert r["grad_bytes"] == 4 * r["n_params"] and r["ring_factor"] == pytest.approx(1.0)
    assert r["allreduce_bytes_measured"] == r["grad_bytes"] and sum(r["bucket_bytes"]) == r["grad_bytes"]
    assert r["comm_ms"] > 0 and "gloo:all_reduce" in r["comm_events"] and r["comm_calls_per_step"] >= 1
    assert r["env"] == MULTICAST_ENV
    assert r["torch"] and r["date"] and r["commit"]  # provenance
    # resumable: the same call measures nothing new
    proc = _torchrun(args, tmp_path)
    assert "[ddp] stored" in proc.stdout
    assert len(ResultStore("ddp", "cpu", tmp_path / "results").rows()) == 1


def test_ddp_gradients_and_losses_equal_single_process(tmp_path):
    script = tmp_path / "check.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        from ftlib.harness import distributed as D
        from ftlib.model.config import preset
        from ftlib.training.trainer import Recipe
        info = D.setup("cpu")
        cfg = preset("gpt2", n_layer=1, n_embd=32, n_head=4, n_kv_head=4)
        g = D.grad_check(cfg, {B}, {T}, seed=3)
        t = D.ddp_train(cfg, Recipe(steps=3, batch_size={2 * B}, block_size={T}, grad_clip=1.0, seed=3))
        if info.rank == 0:
            print("RESULT " + json.dumps({{"grad": g, "train": t}}))
        D.teardown()
    """))
    proc = _torchrun([str(script)], tmp_path)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    res = json.loads(line[len("RESULT "):])
    assert res["grad"]["check_rel_err"] < 1e-6
    train = res["train"]
    assert train["world_size"] == 2 and len(train["losses"]) == 3
    assert train["max_rel_diff"] < 1e-6, (train["losses"], train["reference_losses"])
