"""The four switches, attention equivalence, determinism."""

import pytest
import torch

from ftlib import build_model, preset
from ftlib.model.attention import CausalSelfAttention, causal_attention_ref, kv_for_sdpa
from ftlib.model.norm import LayerNorm, RMSNorm

SMALL = dict(n_layer=2, n_embd=64, n_head=4, n_kv_head=4, block_size=32)


def shapes(model):
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def diff_keys(a, b):
    sa, sb = shapes(a), shapes(b)
    return {k for k in sa.keys() | sb.keys() if sa.get(k) != sb.get(k)}


def test_kv_heads_switch_changes_only_qkv():
    base = build_model("gpt2", **SMALL)
    for nkv in (1, 2):
        m = build_model("gpt2", **{**SMALL, "n_kv_head": nkv})
        changed = diff_keys(base, m)
        assert changed and all(k.endswith(("attn.qkv.weight", "attn.qkv.bias")) for k in changed)
        hs = 64 // 4
        assert m.blocks[0].attn.qkv.weight.shape == (64 + 2 * nkv * hs, 64)


def test_attn_impl_switch_changes_no_parameter():
    a = build_model("gpt2", seed=0, **SMALL)
    b = build_model("gpt2", seed=0, **SMALL, attn_impl="sdpa")
    assert diff_keys(a, b) == set()
    assert b.blocks[0].attn.attn_impl == "sdpa" and a.blocks[0].attn.attn_impl == "explicit"


def test_mlp_ratio_switch_changes_only_mlp():
    a = build_model("gpt2", **SMALL)
    b = build_model("gpt2", **SMALL, mlp_ratio=2)
    changed = diff_keys(a, b)
    assert changed and all(".mlp." in k for k in changed)
    assert b.blocks[0].mlp.fc.weight.shape == (128, 64)


def test_norm_switch_changes_only_norms():
    a = build_model("gpt2", **SMALL)
    b = build_model("gpt2", **SMALL, norm="rmsnorm")
    changed = diff_keys(a, b)
    assert changed and all(("norm" in k) and k.endswith(".bias") for k in changed)  # RMSNorm drops the bias
    kinds_a = {type(m) for m in a.modules() if isinstance(m, (LayerNorm, RMSNorm))}
    kinds_b = {type(m) for m in b.modules() if isinstance(m, (LayerNorm, RMSNorm))}
    assert kinds_a == {LayerNorm} and kinds_b == {RMSNorm}
    assert sum(isinstance(m, RMSNorm) for m in b.modules()) == 2 * 2 + 1


def test_bias_switch():
    m = build_model("gpt2", **SMALL, bias=False)
    assert all(mod.bias is None for mod in m.modules() if isinstance(mod, torch.nn.Linear))


def test_tie_weights():
    m = build_model("gpt2", **SMALL, tie_weights=True)
    assert m.head.weight is m.wte.weight
    untied = build_model("gpt2", **SMALL)
    assert untied.num_params() - m.num_params() == 65 * 64


def _grads(model, x, y):
    model.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
@pytest.mark.parametrize("kv_layout", ["expand", "repeat", "gqa"])
def test_explicit_and_sdpa_agree(n_kv_head, kv_layout):
    torch.manual_seed(0)
    cfg = dict(SMALL, n_kv_head=n_kv_head, kv_layout=kv_layout)
    a = build_model("gpt2", seed=1, **cfg).double()
    b = build_model("gpt2", seed=1, **cfg, attn_impl="sdpa").double()
    x = torch.randint(0, 65, (3, 29))
    y = torch.randint(0, 65, (3, 29))
    la, ga = _grads(a, x, y)
    lb, gb = _grads(b, x, y)
    torch.testing.assert_close(la, lb, rtol=1e-10, atol=1e-10)
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], rtol=1e-8, atol=1e-10, msg=n)


def test_gpt2_preset_explicit_vs_sdpa_fp32():
    a = build_model("gpt2", seed=3, n_layer=2)
    b = build_model("gpt2", seed=3, n_layer=2, attn_impl="sdpa")
    x = torch.randint(0, 65, (2, 64))
    la, ga = _grads(a, x, x.roll(-1, 1))
    lb, gb = _grads(b, x, x.roll(-1, 1))
    torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-6)
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], rtol=1e-4, atol=1e-6, msg=n)


def test_explicit_attention_is_causal():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 10, 8, dtype=torch.float64) for _ in range(3))
    y = causal_attention_ref(q, k, v)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 6:] += 5.0
    v2[:, :, 6:] -= 3.0
    y2 = causal_attention_ref(q, k2, v2)
    torch.testing.assert_close(y[:, :, :6], y2[:, :, :6])  # the future does not leak
    assert not torch.allclose(y[:, :, 6:], y2[:, :, 6:])


def test_expand_is_a_zero_copy_view_for_mqa():
    k = torch.randn(2, 1, 5, 8)
    ke, gqa = kv_for_sdpa(k, 4, "expand")
    assert ke.shape == (2, 4, 5, 8) and ke.stride(1) == 0 and ke.data_ptr() == k.data_ptr() and not gqa
    kb, _ = kv_for_sdpa(k, 4, "broadcast")
    assert kb.shape == (2, 1, 5, 8)
    kr, _ = kv_for_sdpa(k, 4, "repeat")
    assert kr.data_ptr() != k.data_ptr()
    kg, gqa = kv_for_sdpa(torch.randn(2, 2, 5, 8), 4, "gqa")
    assert gqa and kg.shape == (2, 2, 5, 8)


def test_kv_choice_is_visible():
    cfg = preset("fasttransformer")
    assert "stride-0 expand" in CausalSelfAttention(cfg).kv_description()
    assert "math backend" in CausalSelfAttention(cfg.replace(kv_layout="broadcast")).kv_description()
    gpt2 = CausalSelfAttention(preset("gpt2")).kv_description()
    assert "explicit" in gpt2 and "broadcast" not in gpt2  # 8 K/V heads for 8 query heads: nothing to broadcast
    mqa = CausalSelfAttention(preset("gpt2", n_kv_head=1)).kv_description()
    assert "(B,1,T,32)" in mqa and "broadcast over 8 query heads" in mqa


def test_determinism_under_seed():
    a = build_model("fasttransformer", seed=7, n_layer=2)
    b = build_model("fasttransformer", seed=7, n_layer=2)
    c = build_model("fasttransformer", seed=8, n_layer=2)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n
    assert not torch.equal(a.blocks[0].attn.qkv.weight, c.blocks[0].attn.qkv.weight)
    x = torch.randint(0, 65, (2, 16))
    assert torch.equal(a(x)[0], b(x)[0])


def test_seed_does_not_touch_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    build_model("gpt2", seed=5, n_layer=1)
    assert torch.equal(torch.rand(1), expected)


@pytest.mark.parametrize("init", ["normal", "gpt2"])
def test_init_schemes(init):
    m = build_model("gpt2", seed=0, init=init)
    w = m.blocks[0].mlp.fc.weight
    assert abs(w.std().item() - 0.02) < 0.002
    assert torch.count_nonzero(m.blocks[0].mlp.fc.bias) == 0
    proj_std = m.blocks[0].mlp.proj.weight.std().item()
    expected = 0.02 / (2 * 6) ** 0.5 if init == "gpt2" else 0.02
    assert abs(proj_std - expected) < 0.15 * expected


def test_torch_init_is_pytorch_default():
    m = build_model("gpt2", seed=0)
    assert m.wte.weight.std().item() > 0.5  # nn.Embedding default is N(0, 1)


def test_generate_shapes_and_context_crop():
    m = build_model("fasttransformer", seed=0, n_layer=1, block_size=8).eval()
    out = m.generate(torch.zeros(2, 3, dtype=torch.long), 10, top_k=5, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 13) and out.max() < 65


def test_import_has_no_side_effects():
    import subprocess
    import sys

    # Every module of every layer, imported in a fresh interpreter.
    code = (
        "import torch; a=(torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision());"
        "import importlib, pkgutil, ftlib;"
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages(ftlib.__path__, 'ftlib.')];"
        "b=(torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()); assert a==b, (a,b)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
