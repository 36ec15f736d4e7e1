"""The engine's ``attention_pack_heads`` option (on trial): validated as a bool, off by default; on an MQA model
on the packed layout every query head of the K/V head goes in one tile of the attention's forward and dQ kernels
(the launchers get pack_heads = the query heads per K/V head) and the step trains as with one head a tile; where
packing cannot apply (multi-head attention, the heads layout) a note says why and the launchers get 1."""

from __future__ import annotations

import pytest
import torch
from call_spy import record_attention_launches

from ftlib.harness.engine_check import pattern_batches
from ftlib.model.config import preset
from ftlib.training.engine import Engine, EngineOptions

pytest.importorskip("triton")

B, T = 1, 16
FT4 = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T)  # 4 heads share K/V
GPT_MHA = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=T, attn_impl="sdpa")


def test_off_by_default_and_a_bool():
    assert EngineOptions().attention_pack_heads is False  # on trial: only a measured winner becomes a default
    with pytest.raises(ValueError, match="attention_pack_heads"):
        EngineOptions(attention_pack_heads=4)


def test_packing_reaches_both_launchers_and_trains_like_one_head_a_tile(kernel_device, monkeypatch):
    fwd, bwd = record_attention_launches(monkeypatch, "pack_heads")
    batches = pattern_batches(FT4.vocab_size, B, T, 3, seed=2, device=kernel_device)
    losses = {}
    for pack in (False, True):
        fwd.clear(), bwd.clear()
        eng = Engine(FT4, B, T, "tf32", kernel_device, seed=3, capture=False, attention_pack_heads=pack)
        losses[pack] = torch.stack([eng.step(x, y).detach().clone() for x, y in batches])
        want = 4 if pack else 1
        assert fwd == {want} and bwd == {want}, (pack, fwd, bwd)
        assert eng.describe()["attention_pack_heads"] is pack
        assert "attention_pack_heads" not in eng.describe()["notes"]
    # the same sums per row: only the rows' places in the tiles differ
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cfg,layout,why", [(GPT_MHA, "packed", "1 query heads per K/V head"),
                                            (FT4, "heads", "the heads layout")])
def test_where_packing_cannot_apply_a_note_says_why(cfg, layout, why, kernel_device):
    eng = Engine(cfg, B, T, "tf32", kernel_device, capture=False, attention_pack_heads=True, attention_layout=layout)
    assert eng.kernels["attention"] and eng.describe()["attention_pack_heads"] is False
    assert why in eng.describe()["notes"]["attention_pack_heads"]


def test_its_trial_is_over_and_it_stays_an_option_with_its_checks():
    """The trial won by a few microseconds, beyond the spread in half its runs only (chapter 6's table): the
    option stays off, leaves the options on trial, and keeps its 100-step checks."""
    from ftlib.harness.engine_check import CHECKS
    from ftlib.harness.suites import CANDIDATES, SUITES

    assert EngineOptions().attention_pack_heads is False
    assert not [c for c in CANDIDATES if "attention_pack_heads" in c[1]]
    assert not [c for c in SUITES["engine_candidates"].cases() if "pack-heads" in c.label]
    for prec in ("bf16", "tf32"):
        assert (prec, "fasttransformer", {"attention_pack_heads": True}) in CHECKS
