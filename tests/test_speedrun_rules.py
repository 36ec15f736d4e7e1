"""The speedrun's rules: evaluation off the clock, the whole-split loss at the stop, tokens to target."""

from __future__ import annotations

import math
import time

import pytest
import torch

from ftlib import preset
from ftlib.training.data import load_tinyshakespeare
from ftlib.training.trainer import Recipe, full_split_loss, train

TINY = dict(n_layer=1, n_embd=32, n_head=4, n_kv_head=1, block_size=16)


@pytest.fixture(scope="module")
def ds():
    return load_tinyshakespeare(download=False)


def test_full_split_loss_is_every_position_once():
    torch.manual_seed(0)
    model = __import__("ftlib").GPT(preset("fasttransformer", dropout=0.3, **TINY))  # dropout: eval mode matters
    data = torch.randint(0, 65, (5 * 16 + 7 + 1,))  # 87 positions: five whole windows and one of 7
    got, n = full_split_loss(model, data, 16, torch.device("cpu"), windows_per_batch=2)
    assert model.training and n == len(data) - 1
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, n, 16):  # one window at a time, each position's -log p of its next token
            x, y = data[i:min(i + 16, n)], data[i + 1:min(i + 17, n + 1)]
            logp = torch.log_softmax(model(x[None])[0][0].double(), dim=-1)
            total -= logp.gather(1, y[:, None]).sum().item()
    assert got == pytest.approx(total / n, rel=1e-6)


def test_evaluation_is_not_timed(ds, monkeypatch):
    # Evaluations that take 0.5 s each: none of it may enter the training time, nor the whole-split loss.
    import ftlib.training.trainer as tr

    calls = []

    def slow_estimate(*a, **k):
        time.sleep(0.5)
        calls.append(1)
        return 5.0 - len(calls)  # the third evaluation (both splits: calls 5 and 6) is at or below 0.5

    def slow_full(*a, **k):
        time.sleep(0.5)
        return 0.25, 10

    monkeypatch.setattr(tr, "estimate_loss", slow_estimate)
    monkeypatch.setattr(tr, "full_split_loss", slow_full)
    rec = Recipe(steps=10, batch_size=2, block_size=16, eval_interval=2, eval_iters=1)
    out = train(preset("fasttransformer", **TINY), rec, ds, target_val_loss=0.5, progress=False)
    assert out["reached"]["step"] == 4 and len(calls) == 6
    # The steps after the first (tiny) hold no evaluation: three evaluations lie between them.
    assert out["reached"]["time_s"] - out["startup_s"] < 0.5 and out["train_time_s"] == out["reached"]["time_s"]
    assert out["full_val_loss"] == 0.25 and out["full_val_s"] >= 0.5


def test_tiny_run_stores_the_rules_fields(ds, tmp_path, monkeypatch):
    from ftlib.harness.convergence import run_key, run_study

    monkeypatch.setenv("FTLIB_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr("ftlib.harness.convergence.sample_text", lambda *a, **k: "")
    cfg = preset("fasttransformer", **TINY)
    rec = Recipe(steps=200, batch_size=8, block_size=16, lr=3e-3, eval_interval=10, eval_iters=2)
    (row,) = run_study("s", {"tiny": (cfg, rec)}, ds, [0], "cpu", target_val_loss=3.6, progress=False)
    assert row["key"] == run_key("s", cfg, rec, 3.6)  # the new fields leave the key as it was
    assert row["steps_to_target"] is not None and 0 < row["steps_to_target"] < 200
    assert row["tokens_to_target"] == row["steps_to_target"] * 8 * 16
    assert row["val_loss_at_target"] <= 3.6
    assert row["full_val_positions"] == len(ds.val) - 1 and row["full_val_eval_s"] > 0
    assert math.isfinite(row["full_val_loss_at_target"])
    assert abs(row["full_val_loss_at_target"] - row["val_loss_at_target"]) < 0.3
    # A run that does not reach its target records none of them.
    short = rec.replace(steps=2, eval_interval=2)
    (miss,) = run_study("s", {"tiny": (cfg, short)}, ds, [0], "cpu", target_val_loss=0.1, progress=False)
    assert miss["full_val_loss_at_target"] is None and miss["tokens_to_target"] is None
