"""The engine's ``explicit_heavy_first`` option (on trial): validated as a bool, off by default; where GPT-2's
explicit-attention kernels take the attention (fuse_softmax_matmuls) their launchers get heavy_first (each grid's
heaviest causal block launched first) and the step trains exactly as in the default order, the same programs
computing the same sums; where those kernels do not take it a note says why."""

from __future__ import annotations

import pytest
import torch
from call_spy import record_attention_launches
from on_trial import assert_on_trial
from small_engines import FT, GPT2, engine, train

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


def test_it_is_off_by_default_a_bool_and_on_trial_with_its_checks():
    assert_on_trial("explicit_heavy_first", "gpt2 explicit-heavy-first", "gpt2")
