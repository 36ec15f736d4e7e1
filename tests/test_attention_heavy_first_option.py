"""The engine's ``attention_heavy_first`` option (on trial): validated as a bool, off by default; on the packed
layout the attention's launchers get heavy_first (each grid's heaviest causal block launched first) and the step
trains exactly as in the default order, the same programs computing the same sums; on the heads layout a note
says why it does not apply and the launchers keep the default order."""

from __future__ import annotations

import pytest
import torch
from call_spy import record_attention_launches
from on_trial import assert_on_trial
from small_engines import FT, engine, train

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


def test_it_is_off_by_default_a_bool_and_on_trial_with_its_checks():
    assert_on_trial("attention_heavy_first", "fasttransformer heavy-first", "fasttransformer")
