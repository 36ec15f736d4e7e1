"""The engine's ``attention_heavy_first`` option (a default: it won its trial): validated as a bool; on the packed
layout the attention's launchers get heavy_first (each grid's heaviest causal block launched first) and the step
trains exactly as in the default order, the same programs computing the same sums; on the heads layout a note
says why it does not apply and the launchers keep the default order."""

from __future__ import annotations

import pytest
import torch
from call_spy import record_attention_launches
from small_engines import FT, engine, train
from won_trial import assert_won_trial

pytest.importorskip("triton")


def test_it_reaches_both_launchers_and_trains_as_the_default_order(kernel_device, monkeypatch):
    fwd, bwd = record_attention_launches(monkeypatch, "heavy_first")
    losses = {}
    for heavy in (False, True):
        fwd.clear(), bwd.clear()
        eng, losses[heavy] = train(FT, "tf32", kernel_device, attention_heavy_first=heavy)
        assert fwd == {heavy} and bwd == {heavy}, (heavy, fwd, bwd)
        assert eng.describe()["attention_heavy_first"] is heavy
        assert "attention_heavy_first" not in eng.describe()["notes"]
    assert torch.equal(losses[True], losses[False])  # the same programs and sums, launched in another order


def test_on_the_heads_layout_a_note_says_why(kernel_device):
    eng = engine(FT, "tf32", kernel_device, attention_heavy_first=True, attention_layout="heads")
    assert eng.kernels["attention"] and eng.describe()["attention_heavy_first"] is False
    assert "the heads layout" in eng.describe()["notes"]["attention_heavy_first"]


def test_it_won_its_trial_and_has_an_ablation_and_checks():
    assert_won_trial("attention_heavy_first", "fasttransformer -heavy-first", "fasttransformer", ("bf16", "tf32"))


def test_a_row_without_it_is_an_earlier_engines_only_where_it_could_apply():
    from ftlib.views.engine_config import options_off

    ran = {"kernels": ["attention"], "notes": {}, "attention_layout": "packed"}
    row = {"mode": "engine", "config": {"n_head": 4, "n_kv_head": 1}, "extra": {}, "precision": "tf32",
           "engine": {**ran, "attention_heavy_first": False}}
    assert "attention_heavy_first" in options_off(row)
    assert "attention_heavy_first" in options_off({**row, "engine": ran})  # stored before the option existed
    assert "attention_heavy_first" not in options_off({**row, "engine": {**ran, "attention_heavy_first": True}})
    assert "attention_heavy_first" not in options_off({**row, "extra": {"attention_heavy_first": False}})
    heads = {**ran, "attention_layout": "heads", "attention_heavy_first": False}
    assert "attention_heavy_first" not in options_off({**row, "engine": heads})
    sdpa = {**ran, "kernels": [], "attention_heavy_first": False}  # SDPA kept: no flash kernel to order
    assert "attention_heavy_first" not in options_off({**row, "engine": sdpa})
