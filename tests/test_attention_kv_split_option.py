"""The engine's ``attention_kv_split`` option: validated, the value reaches the attention backward's dK/dV
launch on an MQA model (the launcher's own choice without it), the step trains as with the launcher's
choice, and where the value does not divide a model's query heads per K/V head a note says so."""

from __future__ import annotations

import pytest
import torch
from call_spy import record_calls

from ftlib.harness.engine_check import pattern_batches
from ftlib.model.config import preset
from ftlib.training.engine import Engine, EngineOptions

pytest.importorskip("triton")

B, T = 2, 16
FT4 = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T)  # 4 heads share K/V
GPT_MHA = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=T, attn_impl="sdpa")


def test_bad_values_are_refused():
    for bad in (0, 3, -2, True, 2.0, "4"):
        with pytest.raises(ValueError, match="attention_kv_split"):
            EngineOptions(attention_kv_split=bad)
    with pytest.raises(ValueError, match="needs attention_layout='packed'"):
        EngineOptions(attention_kv_split=2, attention_layout="heads")
    assert EngineOptions().attention_kv_split is None  # the launcher's choice, unless a trial says otherwise


def test_the_split_reaches_the_backward_and_trains_like_the_launchers(kernel_device, monkeypatch):
    import kernels.attention as A

    seen = record_calls(monkeypatch, A, "attention_bwd", lambda a: a.get("kv_split"))
    batches = pattern_batches(FT4.vocab_size, B, T, 3, seed=2, device=kernel_device)
    losses = {}
    for split in (None, 1, 4):
        seen.clear()
        eng = Engine(FT4, B, T, "tf32", kernel_device, seed=3, capture=False, attention_kv_split=split)
        losses[split] = torch.stack([eng.step(x, y).detach().clone() for x, y in batches])
        assert seen == {split}, (split, seen)
        assert eng.describe()["attention_kv_split"] == split
    for split in (1, 4):  # the same gradients, summed over the query heads in another grouping
        torch.testing.assert_close(losses[split], losses[None], rtol=1e-4, atol=1e-5)


def test_a_split_that_does_not_divide_the_group_leaves_the_launchers_choice(kernel_device):
    eng = Engine(GPT_MHA, B, T, "tf32", kernel_device, attention_kv_split=2)
    assert eng.kernels["attention"] and eng.describe()["attention_kv_split"] is None
    assert "does not divide the 1 query heads per K/V head" in eng.describe()["notes"]["attention_kv_split"]


def test_the_split_of_two_stays_on_trial_beside_the_concurrent_dq_kernel_under_a_label_of_its_own():
    """The earlier trial ran the dK/dV kernel after the dQ kernel: its rows (labels 'kv-split 8', 'kv-split 2')
    must never pair with the new trial's, whose labels neither extend nor are extended by them; each split has
    its 100-step check. The split of 8 lost beside the dQ kernel too and left the trial."""
    from ftlib.harness.engine_check import CHECKS
    from ftlib.harness.suites import CANDIDATES

    trials = {c[1]["attention_kv_split"]: c for c in CANDIDATES if "attention_kv_split" in c[1]}
    assert set(trials) == {2}
    assert EngineOptions().attention_bwd_streams is True  # the change that reopened the trial
    for n in (8, 2):
        assert ("bf16", "fasttransformer", {"attention_kv_split": n}) in CHECKS
    for n, (suffix, _, bases, precs) in trials.items():
        assert bases == ("fasttransformer",) and set(precs) == {"bf16", "tf32"}
        old = f" kv-split {n}"
        assert not suffix.startswith(old) and not old.startswith(suffix)
