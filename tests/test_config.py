"""Config validation, presets and parameter counts."""

import pytest

from ftlib import ModelConfig, build_model, preset
from ftlib.config import PRESETS


@pytest.mark.parametrize(
    "name,count",
    [("gpt2", 4_837_888), ("fasttransformer", 2_559_744), ("nanogpt-char", 10_745_088)],
)
def test_preset_parameter_counts(name, count):
    # gpt2 / fasttransformer: shared/reference/facts.md; nanogpt-char: nanoGPT prints 10.65M,
    # which excludes the 256*384 position embedding: 10,745,088 - 98,304 = 10,646,784.
    assert build_model(name).num_params() == count


def test_nanogpt_char_matches_nanogpt_report():
    m = build_model("nanogpt-char")
    assert m.num_params() - m.wpe.weight.numel() == 10_646_784


def test_presets_exactly_as_original():
    g, f = preset("gpt2"), preset("fasttransformer")
    assert (g.n_embd, g.n_layer, g.n_head, g.n_kv_head, g.block_size, g.vocab_size) == (256, 6, 8, 8, 256, 65)
    assert (g.attn_impl, g.norm, g.mlp_ratio, g.bias, g.activation) == ("explicit", "layernorm", 4, True, "gelu_tanh")
    assert (f.n_kv_head, f.attn_impl, f.norm, f.mlp_ratio, f.bias) == (1, "sdpa", "rmsnorm", 2, False)
    assert build_model("fasttransformer").blocks[0].attn.qkv.weight.shape == (320, 256)
    assert build_model("gpt2").blocks[0].attn.qkv.weight.shape == (768, 256)


@pytest.mark.parametrize(
    "kwargs,words",
    [
        (dict(n_embd=250, n_head=8), ["n_embd=250", "n_head=8"]),
        (dict(n_head=8, n_kv_head=3), ["n_head=8", "n_kv_head=3"]),
        (dict(n_kv_head=0), ["n_kv_head=0"]),
        (dict(n_layer=0), ["n_layer=0"]),
        (dict(mlp_ratio=0), ["mlp_ratio=0"]),
        (dict(mlp_ratio=1.001), ["mlp_ratio=1.001"]),
        (dict(norm="batchnorm"), ["norm='batchnorm'"]),
        (dict(attn_impl="flash3"), ["attn_impl='flash3'"]),
        (dict(kv_layout="weird"), ["kv_layout='weird'"]),
        (dict(init="xavier"), ["init='xavier'"]),
        (dict(dropout=1.0), ["dropout=1.0"]),
        (dict(n_head=8, n_kv_head=2, attn_impl="sdpa", kv_layout="broadcast"), ["n_kv_head=2"]),
        (dict(vocab_size=6.5), ["vocab_size=6.5"]),
    ],
)
def test_invalid_configs_name_the_values(kwargs, words):
    with pytest.raises(ValueError) as e:
        ModelConfig(**kwargs)
    for w in words:
        assert w in str(e.value)


def test_two_errors_reported_together():
    with pytest.raises(ValueError) as e:
        ModelConfig(n_embd=250, n_head=8, norm="x")
    assert "n_embd=250" in str(e.value) and "norm='x'" in str(e.value)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'gpt3'.*fasttransformer"):
        preset("gpt3")


def test_sequence_longer_than_context():
    import torch

    m = build_model("gpt2", n_layer=1, block_size=16)
    with pytest.raises(ValueError, match="T=17.*block_size=16"):
        m(torch.zeros(1, 17, dtype=torch.long))


def test_replace_validates():
    with pytest.raises(ValueError, match="n_kv_head=3"):
        preset("gpt2").replace(n_kv_head=3)


def test_grouped_query_and_any_mlp_ratio_are_valid():
    c = preset("gpt2", n_kv_head=2, mlp_ratio=8 / 3 * 3 / 2)  # 4.0 via float arithmetic
    assert c.d_ff == 1024
    assert preset("gpt2", mlp_ratio=1.5).d_ff == 384


def test_config_hash_stable_and_distinct():
    assert preset("gpt2").config_hash() == preset("gpt2").config_hash()
    hashes = {preset(n).config_hash() for n in PRESETS}
    assert len(hashes) == len(PRESETS)


def test_attention_dropout_defaults_to_dropout_and_keeps_old_hashes():
    cfg = preset("fasttransformer", dropout=0.1)
    assert cfg.attn_dropout is None and cfg.attn_dropout_p == 0.1
    assert "attn_dropout" not in cfg.to_dict()  # stored result keys predate the field
    split = cfg.replace(attn_dropout=0.0)
    assert split.attn_dropout_p == 0.0 and split.to_dict()["attn_dropout"] == 0.0
    assert split.config_hash() != cfg.config_hash()
    assert ModelConfig(**split.to_dict()) == split
    with pytest.raises(ValueError, match="attn_dropout=1.5"):
        cfg.replace(attn_dropout=1.5)


def test_attention_dropout_zero_leaves_residual_dropout_on():
    import torch

    from ftlib.model import build_model

    m = build_model(preset("fasttransformer", n_layer=1, dropout=0.5, attn_dropout=0.0, block_size=16), seed=0)
    attn = m.blocks[0].attn
    assert attn.dropout == 0.0 and attn.resid_dropout.p == 0.5
    m.train()
    x = torch.randint(0, 65, (2, 16))
    a, b = m(x)[0], m(x)[0]
    assert not torch.equal(a, b)  # residual dropout still draws a new mask each call
