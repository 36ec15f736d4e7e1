"""Config validation, presets and parameter counts."""

import pytest

from ftlib import ModelConfig, build_model, preset
from ftlib.model.config import PRESETS


@pytest.mark.parametrize(
    "name,count",
    [("gpt2", 4_837_888), ("fasttransformer", 2_559_744), ("nanogpt-char", 10_745_088)],
)
def test_preset_parameter_counts(name, count):
    # gpt2 / fasttransformer: the post's 4.84M and 2.56M (ftlib.analysis.claims); nanogpt-char: nanoGPT prints 10.65M,
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

    from ftlib.model.gpt import build_model

    m = build_model(preset("fasttransformer", n_layer=1, dropout=0.5, attn_dropout=0.0, block_size=16), seed=0)
    attn = m.blocks[0].attn
    assert attn.dropout == 0.0 and attn.resid_dropout.p == 0.5
    m.train()
    x = torch.randint(0, 65, (2, 16))
    a, b = m(x)[0], m(x)[0]
    assert not torch.equal(a, b)  # residual dropout still draws a new mask each call


# Values of the wrong type or not finite: each a ValueError naming the field, the value and what is
# allowed; before these checks tie_weights='no' and bias='False' built a model with tied weights
# and biases (a string is truthy), and the others failed later with bare TypeError/OverflowError.
@pytest.mark.parametrize(
    "kwargs,words",
    [
        (dict(tie_weights="no"), ["tie_weights='no'", "True or False"]),
        (dict(bias="False"), ["bias='False'", "True or False"]),
        (dict(bias=0), ["bias=0", "True or False"]),
        (dict(dropout="0.1"), ["dropout='0.1'", "must be a number", "got str"]),
        (dict(mlp_ratio="2"), ["mlp_ratio='2'", "must be a number"]),
        (dict(mlp_ratio=float("inf")), ["mlp_ratio=inf", "finite"]),
        (dict(mlp_ratio=float("nan")), ["mlp_ratio=nan", "finite"]),
        (dict(norm_eps=None), ["norm_eps=None", "must be a number"]),
        (dict(attn_dropout="0"), ["attn_dropout='0'", "(or None)"]),
        (dict(dropout=True), ["dropout=True", "got bool"]),
        (dict(norm=None), ["norm=None", "must be a string"]),
        (dict(n_layer=True), ["n_layer=True", "positive integer"]),
    ],
)
def test_wrong_types_and_non_finite_values_name_the_field(kwargs, words):
    with pytest.raises(ValueError) as e:
        preset("fasttransformer", **kwargs)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_build_model_and_gpt_refuse_what_is_not_a_config():
    from ftlib.model.gpt import GPT

    with pytest.raises(ValueError, match="ModelConfig or a preset name.*got None"):
        build_model(None)
    with pytest.raises(ValueError, match="GPT needs a ModelConfig"):
        GPT({"n_layer": 2})
    with pytest.raises(ValueError, match="unknown preset 3"):
        preset(3)
    with pytest.raises(ValueError, match=r"unknown ModelConfig field\(s\) \['n_layers'\]"):
        preset("gpt2", n_layers=2)
    with pytest.raises(ValueError, match="n_heads"):
        preset("gpt2").replace(n_heads=2)


def test_valid_configs_keep_their_hashes():
    # Stored results are keyed by config_hash(): validation must not change any valid config's hash.
    assert {n: preset(n).config_hash() for n in PRESETS} == {
        "gpt2": "839ca97139a4", "fasttransformer": "f5a285e44cdc", "nanogpt-char": "ff01e4f7831d"}
    assert preset("fasttransformer", kv_layout="broadcast").config_hash() == "febcfce150f1"
    assert preset("gpt2", mlp_ratio=2).config_hash() == "8c23c2aa0ac8"  # an int ratio stays an int
    assert preset("gpt2", mlp_ratio=2.0).config_hash() == "d8c4ff784a43"


def test_every_stored_config_still_validates_to_its_stored_hash():
    import json
    from pathlib import Path

    seen = 0
    for f in sorted((Path(__file__).resolve().parent.parent / "data" / "results").glob("*/*.jsonl")):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            if isinstance(row.get("config"), dict) and "config_hash" in row:
                assert ModelConfig(**row["config"]).config_hash() == row["config_hash"], (f.name, row["key"])
                seen += 1
    assert seen > 100
