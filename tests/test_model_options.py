"""The speedrun's model options: ReLU² MLP, QK-norm, logit soft-capping; off by default, keys unchanged."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ftlib.model.config import PRESETS, ModelConfig, preset
from ftlib.model.gpt import build_model

SMALL = dict(n_layer=1, n_embd=64, n_head=4, block_size=16)


def test_defaults_leave_every_preset_hash_unchanged():
    for name in PRESETS:
        cfg = preset(name)
        assert "qk_norm" not in cfg.to_dict() and "logit_softcap" not in cfg.to_dict()
        assert ModelConfig(**cfg.to_dict()) == cfg
    on = preset("fasttransformer", qk_norm=True, logit_softcap=30.0, activation="relu2")
    assert on.config_hash() != preset("fasttransformer").config_hash()
    assert ModelConfig(**on.to_dict()) == on


@pytest.mark.parametrize("changes,match", [({"qk_norm": "yes"}, "qk_norm='yes' must be True or False"),
                                           ({"logit_softcap": 0.0}, "logit_softcap=0.0 must be None or positive"),
                                           ({"logit_softcap": "30"}, "must be a number"),
                                           ({"activation": "swish"}, "activation='swish' is not one of")])
def test_bad_values_are_refused(changes, match):
    with pytest.raises(ValueError, match=match):
        preset("fasttransformer", **changes)


def test_relu2_is_relu_squared():
    model = build_model(preset("fasttransformer", activation="relu2", **SMALL), seed=0)
    mlp = model.blocks[0].mlp
    x = torch.randn(2, 5, 64)
    assert torch.equal(mlp(x), mlp.proj(F.relu(mlp.fc(x)) ** 2))


@pytest.mark.parametrize("impl", ["sdpa", "explicit"])
def test_qk_norm_normalizes_each_heads_queries_and_keys(impl):
    cfg = preset("fasttransformer", attn_impl=impl, qk_norm=True, **SMALL)
    attn = build_model(cfg, seed=0).blocks[0].attn
    x = torch.randn(2, 8, 64)
    B, T, C, hs = 2, 8, 64, cfg.head_size
    q, k, v = attn.qkv(x).split([C, hs, hs], dim=-1)
    q = F.rms_norm(q.view(B, T, 4, hs).transpose(1, 2), (hs,), eps=cfg.norm_eps)
    k = F.rms_norm(k.view(B, T, 1, hs).transpose(1, 2), (hs,), eps=cfg.norm_eps).expand(B, 4, T, hs)
    v = v.view(B, T, 1, hs).transpose(1, 2).expand(B, 4, T, hs)
    want = attn.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C))
    torch.testing.assert_close(attn(x), want, rtol=1e-5, atol=1e-6)
    plain = build_model(cfg.replace(qk_norm=False), seed=0).blocks[0].attn
    assert not torch.allclose(plain(x), want, atol=1e-4)  # the option changes the function


def test_logit_softcap_bounds_the_logits():
    cfg = preset("fasttransformer", logit_softcap=2.0, **SMALL)
    model = build_model(cfg, seed=0)
    with torch.no_grad():
        model.head.weight.mul_(100)  # logits far beyond the cap
        idx = torch.randint(0, 65, (2, 8))
        logits, loss = model(idx, idx)
        raw = model.head(model.norm_f(model.blocks[0](
            *_first_block_inputs(model, idx))[0]))
    assert logits.abs().max() <= 2.0 and raw.abs().max() > 2.0
    assert math.isfinite(loss.item())


def _first_block_inputs(model, idx):
    x = model.wte(idx) + model.wpe(torch.arange(idx.shape[1]))
    return x, model.blocks[0].norm1(x), model.norm_f, model.add_norm


def test_the_engine_trains_the_options_as_reference_training_does(kernel_device):
    """QK-norm keeps PyTorch's attention (the kernel reads q and k straight from the projection);
    ReLU² and the soft-cap run inside the model's own forward. The losses and weights match."""
    from ftlib.harness.engine_check import check_against_reference

    cfg = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=16, qk_norm=True,
                 activation="relu2", logit_softcap=15.0)
    r = check_against_reference(cfg, steps=3, device=kernel_device, B=2, T=16)
    assert r["ok"], r["max_rel_err"]
    assert "attention" not in r["kernels"] and "cross_entropy" in r["kernels"]
