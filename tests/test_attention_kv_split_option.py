"""The engine's ``attention_kv_split`` option (a default, 2, since its trial beside the concurrent dQ kernel):
validated, the value reaches the attention backward's dK/dV launch on an MQA model (the launcher's own choice
with None), the step trains as with the launcher's choice, where the value does not divide a model's query
heads per K/V head a note says so, and the heads layout keeps the launcher's choice."""

from __future__ import annotations

import pytest
import torch
from call_spy import record_calls

from ftlib.harness.engine_check import pattern_batches
from ftlib.model.config import preset
from ftlib.training.engine import Engine, EngineOptions

pytest.importorskip("triton")

B, T = 1, 16
FT4 = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T)  # 4 heads share K/V
GPT_MHA = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=T, attn_impl="sdpa")


def test_bad_values_are_refused():
    for bad in (0, 3, -2, True, 2.0, "4"):
        with pytest.raises(ValueError, match="attention_kv_split"):
            EngineOptions(attention_kv_split=bad)
    assert EngineOptions().attention_kv_split == 2  # it won its trial beside the concurrent dQ kernel


def test_the_split_reaches_the_backward_and_trains_like_the_launchers(kernel_device, monkeypatch):
    import kernels.attention as A

    seen = record_calls(monkeypatch, A, "attention_bwd", lambda a: a.get("kv_split"))
    batches = pattern_batches(FT4.vocab_size, B, T, 3, seed=2, device=kernel_device)
    losses = {}
    for split in (None, 1, 4, 2):
        seen.clear()
        eng = Engine(FT4, B, T, "tf32", kernel_device, seed=3, capture=False, attention_kv_split=split)
        losses[split] = torch.stack([eng.step(x, y).detach().clone() for x, y in batches])
        assert seen == {split}, (split, seen)
        assert eng.describe()["attention_kv_split"] == split
    for split in (1, 4, 2):  # the same gradients, summed over the query heads in another grouping
        torch.testing.assert_close(losses[split], losses[None], rtol=1e-4, atol=1e-5)


def test_a_split_that_does_not_divide_the_group_leaves_the_launchers_choice(kernel_device):
    eng = Engine(GPT_MHA, B, T, "tf32", kernel_device, attention_kv_split=2)
    assert eng.kernels["attention"] and eng.describe()["attention_kv_split"] is None
    assert "does not divide the 1 query heads per K/V head" in eng.describe()["notes"]["attention_kv_split"]


def test_the_default_split_reaches_the_packed_layout_only(kernel_device, monkeypatch):
    import kernels.attention as A

    seen = record_calls(monkeypatch, A, "attention_bwd", lambda a: a.get("kv_split"))
    (x, y), = pattern_batches(FT4.vocab_size, B, T, 1, seed=2, device=kernel_device)
    for layout, want in (("packed", 2), ("heads", None)):
        seen.clear()
        eng = Engine(FT4, B, T, "tf32", kernel_device, seed=3, capture=False, attention_layout=layout)
        eng.step(x, y)
        assert seen == {want} and eng.describe()["attention_kv_split"] == want, (layout, seen)


def test_the_split_of_two_won_its_trial_and_has_an_ablation_and_checks():
    """The earlier trial ran the dK/dV kernel after the dQ kernel (labels 'kv-split 8', 'kv-split 2'); beside it
    (labels 'split 8 beside dQ', 'split 2 beside dQ') the split of two won. The engine suite switches it off again
    in each precision it won in, and both splits keep their 100-step checks."""
    from ftlib.harness.engine_check import CHECKS
    from ftlib.harness.suites import CANDIDATES, SUITES

    assert not [c for c in CANDIDATES if "attention_kv_split" in c[1]]
    ablations = {(c.precision, c.label): c.extra for c in SUITES["engine"].cases() if "kv-split" in c.label}
    assert ablations == {(p, "fasttransformer -kv-split-2"): {"attention_kv_split": None} for p in ("bf16", "tf32")}
    for n in (8, 2):
        assert ("bf16", "fasttransformer", {"attention_kv_split": n}) in CHECKS
