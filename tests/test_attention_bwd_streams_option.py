"""The engine's ``attention_bwd_streams`` option: it reaches the attention backward's launch as
``concurrent=True`` (the default engine launches the two kernels one after the other), the step trains as the
default engine's does (captured on CUDA), and with the heads layout, where it does not apply, describe() says
it is off."""

from __future__ import annotations

import pytest
import torch
from call_spy import record_calls

from ftlib.harness.engine_check import pattern_batches
from ftlib.harness.suites import CANDIDATES, SUITES
from ftlib.model.config import preset
from ftlib.training.engine import Engine, EngineOptions

pytest.importorskip("triton")

B, T = 1, 16
FT4 = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T)  # 4 heads share K/V
ON = {"attention_bwd_streams": True}


def test_it_reaches_the_backward_and_trains_like_the_default_engine(kernel_device, monkeypatch):
    import kernels.attention as A

    seen = record_calls(monkeypatch, A, "attention_bwd", lambda a: a.get("concurrent"))
    batches = pattern_batches(FT4.vocab_size, B, T, 3, seed=2, device=kernel_device)
    losses, params = {}, {}
    for on in (False, True):
        seen.clear()
        eng = Engine(FT4, B, T, "tf32", kernel_device, seed=3, lr=1e-2, attention_bwd_streams=on)
        losses[on] = torch.stack([eng.step(x, y).detach().clone() for x, y in batches])
        params[on] = eng.flat_param.detach().clone()
        assert seen == {on}, (on, seen)  # recorded at capture on CUDA, at every step on the CPU
        assert eng.describe()["attention_bwd_streams"] is on
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(params[True], params[False], rtol=1e-5, atol=1e-6)


def test_with_the_heads_layout_it_is_off():
    eng = Engine(FT4, B, T, "fp32", "cpu", use_kernels=False, attention_layout="heads", **ON)
    assert eng.describe()["attention_bwd_streams"] is False
    with pytest.raises(ValueError, match="attention_bwd_streams"):
        EngineOptions(attention_bwd_streams=1)


def test_it_won_its_trial_and_is_a_default_with_its_ablation_in_the_engine_suite():
    assert EngineOptions().attention_bwd_streams is True and not [c for c in CANDIDATES if c[1] == ON]
    ablations = [c for c in SUITES["engine"].cases() if c.extra == {"attention_bwd_streams": False}]
    assert {(c.label, c.precision) for c in ablations} == {("fasttransformer -attn-bwd-streams", "bf16"),
                                                           ("fasttransformer -attn-bwd-streams", "tf32")}
