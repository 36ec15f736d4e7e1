"""The engine's ``attention_tiles`` option: parsed and validated, and the named tiles reach the attention
kernels' launchers (forward and backward apart), with the step training as with the tiles chosen from the
device."""

from __future__ import annotations

import pytest
import torch
from call_spy import record_calls

from ftlib.harness.engine_check import pattern_batches
from ftlib.model.config import preset
from ftlib.training.engine import Engine, EngineOptions

pytest.importorskip("triton")

B, T = 1, 16
FT1 = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T)  # hs = 16


def test_tiles_are_parsed_per_pass_and_bad_text_is_refused():
    from kernels.tiles import Tiles, parse_tiles

    assert parse_tiles("fwd 128x64 w4 s2; bwd 64x32 w8 s3") == {"fwd": Tiles(128, 64, 4, 2),
                                                                "bwd": Tiles(64, 32, 8, 3)}
    assert parse_tiles("bwd 32x32 w4 s1") == {"bwd": Tiles(32, 32, 4, 1)}
    assert Tiles(128, 64, 8, 3).name == "128x64 w8 s3"
    assert parse_tiles(f"fwd {Tiles(64, 16).name}")["fwd"] == Tiles(64, 16)
    for bad in ("fwd 128x64", "mid 64x64 w4 s2", "fwd 64x64 w4 s2; fwd 32x32 w4 s2", "fwd 48x64 w4 s2", ""):
        with pytest.raises(ValueError):
            parse_tiles(bad)
    with pytest.raises(ValueError, match="attention tiles"):
        EngineOptions(attention_tiles="fwd 64x64")
    with pytest.raises(ValueError, match="needs attention_layout='packed'"):
        EngineOptions(attention_tiles="fwd 64x64 w4 s2", attention_layout="heads")


def _flash_tiles(a: dict) -> tuple:  # kernels.attention's launchers take the tiles as keywords
    return a.get("block_m"), a.get("block_n"), a.get("num_warps"), a.get("num_stages")


def _explicit_tiles(a: dict) -> tuple:  # kernels.explicit_attention's take one Tiles
    t = a.get("tiles")
    return (None,) * 4 if t is None else (t.block_m, t.block_n, t.num_warps, t.num_stages)


GPT2 = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=T)  # hs = 16, explicit attention
# model, the module whose launchers take the tiles, their names, how a call names its tiles, and the engine's
# description saying those kernels took the attention (GPT-2 as written: the explicit-attention kernels)
ROUTES = {"flash": (FT1, "kernels.attention", ("attention_fwd", "attention_bwd"), _flash_tiles,
                    lambda d: "attention" in d["kernels"]),
          "explicit": (GPT2, "kernels.explicit_attention", ("explicit_attention_fwd", "explicit_attention_bwd"),
                       _explicit_tiles, lambda d: d["fuse_softmax_matmuls"])}


@pytest.mark.parametrize("route", list(ROUTES))
def test_named_tiles_reach_the_launchers_and_train_like_the_chosen_ones(route, kernel_device, monkeypatch):
    import importlib

    cfg, module, (fwd, bwd), tiles_of, took = ROUTES[route]
    mod = importlib.import_module(module)
    seen = {"fwd": record_calls(monkeypatch, mod, fwd, tiles_of), "bwd": record_calls(monkeypatch, mod, bwd, tiles_of)}
    batches = pattern_batches(cfg.vocab_size, B, T, 3, seed=2, device=kernel_device)
    losses = {}
    for tiles in (None, "fwd 16x16 w2 s1; bwd 16x16 w4 s1"):
        for s in seen.values():
            s.clear()
        eng = Engine(cfg, B, T, "tf32", kernel_device, seed=3, attention_tiles=tiles, capture=False)
        assert took(eng.describe()) and eng.describe()["attention_tiles"] == tiles
        losses[tiles] = torch.stack([eng.step(x, y).detach().clone() for x, y in batches])
        if tiles is None:  # chosen by the launchers
            assert seen["fwd"] == {(None, None, None, None)} and seen["bwd"] == {(None, None, None, None)}
        else:
            assert seen["fwd"] == {(16, 16, 2, 1)} and seen["bwd"] == {(16, 16, 4, 1)}
    # At T = 16 the device would pick 16 x 16 tiles too: warps and stages change the schedule, not the sums.
    torch.testing.assert_close(losses[None], losses["fwd 16x16 w2 s1; bwd 16x16 w4 s1"], rtol=1e-6, atol=1e-6)
