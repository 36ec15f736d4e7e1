"""The engine's ``explicit_heavy_first`` option (a default under bf16 and fp16: it won its trial there, and was mixed
in tf32): validated as a bool; where GPT-2's explicit-attention kernels take the attention (fuse_softmax_matmuls)
under bf16 their launchers get heavy_first (each grid's heaviest causal block launched first) and the step trains
exactly as in the default order, the same programs computing the same sums; in tf32, or where those kernels do not
take it, the launchers keep the default order and a note says why."""

from __future__ import annotations

import pytest
import torch
from call_spy import record_attention_launches
from small_engines import FT, GPT2, engine, train
from won_trial import assert_won_trial

pytest.importorskip("triton")


def test_it_reaches_both_launchers_and_trains_as_the_default_order(kernel_device, monkeypatch):
    fwd, bwd = record_attention_launches(monkeypatch, "heavy_first", explicit=True)
    losses = {}
    for heavy in (False, True):
        fwd.clear(), bwd.clear()
        eng, losses[heavy] = train(GPT2, "bf16", kernel_device, explicit_heavy_first=heavy)
        assert fwd == {heavy} and bwd == {heavy}, (heavy, fwd, bwd)
        assert eng.describe()["explicit_heavy_first"] is heavy
        assert "explicit_heavy_first" not in eng.describe()["notes"]
    assert torch.equal(losses[True], losses[False])  # the same programs and sums, launched in another order


@pytest.mark.parametrize("cfg, options", [(FT, {}), (GPT2, {"fuse_softmax_matmuls": False})],
                         ids=["flash attention", "softmax alone"])
def test_where_the_explicit_kernels_do_not_run_a_note_says_why(kernel_device, cfg, options):
    eng = engine(cfg, "bf16", kernel_device, explicit_heavy_first=True, **options)
    assert eng.describe()["explicit_heavy_first"] is False
    assert "fuse_softmax_matmuls" in eng.describe()["notes"]["explicit_heavy_first"]


def test_in_tf32_the_launchers_keep_the_default_order_and_a_note_says_why(kernel_device, monkeypatch):
    fwd, bwd = record_attention_launches(monkeypatch, "heavy_first", explicit=True)
    eng, _ = train(GPT2, "tf32", kernel_device, steps=1, explicit_heavy_first=True)
    assert fwd == {False} and bwd == {False}, (fwd, bwd)
    assert eng.describe()["explicit_heavy_first"] is False
    assert eng.describe()["notes"]["explicit_heavy_first"].startswith("not applied: bf16 and fp16 only")


def test_it_won_its_trial_and_has_an_ablation_and_checks():
    assert_won_trial("explicit_heavy_first", "gpt2 -explicit-heavy-first", "gpt2", ("bf16",))


def test_a_row_without_it_is_an_earlier_engines_only_where_it_could_apply():
    from ftlib.views.engine_config import options_off

    ran = {"kernels": ["softmax"], "notes": {}, "fused_softmax": True}
    cfg = {"n_embd": 64, "n_head": 2, "attn_impl": "explicit"}
    row = {"mode": "engine", "config": cfg, "extra": {}, "precision": "bf16",
           "engine": {**ran, "explicit_heavy_first": False}}
    assert "explicit_heavy_first" in options_off(row)
    assert "explicit_heavy_first" in options_off({**row, "engine": ran})  # stored before the option existed
    assert "explicit_heavy_first" not in options_off({**row, "engine": {**ran, "explicit_heavy_first": True}})
    assert "explicit_heavy_first" not in options_off({**row, "precision": "tf32"})  # bf16 and fp16 only
    assert "explicit_heavy_first" not in options_off({**row, "extra": {"explicit_heavy_first": False}})
    flash = {**ran, "fused_softmax": False, "explicit_heavy_first": False}  # the flash kernel took the attention
    assert "explicit_heavy_first" not in options_off({**row, "engine": flash})
