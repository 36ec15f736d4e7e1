"""Checks of ftlib.analysis.accounting and ftlib.analysis.peaks against PyTorch and against
hand-derived figures (the closed forms worked out on paper for the two presets).

FlopCounterMode counts matmuls and fused SDPA ops only (see the accounting module
docstring), so the comparisons are on that subset: exact integer equality, no tolerance.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from ftlib import build_model, preset
from ftlib.analysis.accounting import num_params, rows
from ftlib.analysis.backends import attention_matrix_traffic, expected_backend, tt_passes
from ftlib.analysis.claims import POST_CLAIMED
from ftlib.analysis.formulas import flop_counter_flops, kaplan_flops, megatron_flops, palm_flops
from ftlib.analysis.peaks import PEAKS, achieved, flops_floor, lookup, roofline, step_floor
from ftlib.analysis.totals import attention_mlp_fractions, layer_forward_breakdown, step_summary, total_flops

B, T = 2, 48  # small, and T differs from every head size so (T, T) shapes are unambiguous
SMALL = dict(n_layer=2)

CONFIGS = {
    "gpt2": ("gpt2", {}),
    "fasttransformer": ("fasttransformer", {}),
    "nanogpt-char": ("nanogpt-char", {}),  # dropout 0.2 in training: CPU SDPA falls back to math
    "gpt2/mqa": ("gpt2", dict(n_kv_head=1)),
    "gpt2/gqa2": ("gpt2", dict(n_kv_head=2)),
    "gpt2/sdpa": ("gpt2", dict(attn_impl="sdpa")),
    "gpt2/mlp2": ("gpt2", dict(mlp_ratio=2.0)),
    "gpt2/mlp1.5": ("gpt2", dict(mlp_ratio=1.5)),
    "gpt2/rmsnorm": ("gpt2", dict(norm="rmsnorm")),
    "gpt2/nobias": ("gpt2", dict(bias=False)),
    "gpt2/tied": ("gpt2", dict(tie_weights=True)),
    "gpt2/vocab100": ("gpt2", dict(vocab_size=100)),
    "ft/broadcast": ("fasttransformer", dict(kv_layout="broadcast")),
    "ft/gqa": ("fasttransformer", dict(n_kv_head=2, kv_layout="gqa")),
    "ft/repeat": ("fasttransformer", dict(n_kv_head=2, kv_layout="repeat")),
    "ft/expand2": ("fasttransformer", dict(n_kv_head=2, kv_layout="expand")),
    "ft/explicit": ("fasttransformer", dict(attn_impl="explicit")),
    "ft/mha": ("fasttransformer", dict(n_kv_head=8)),
    "ft/mlp4": ("fasttransformer", dict(mlp_ratio=4.0)),
    "ft/layernorm": ("fasttransformer", dict(norm="layernorm")),
    "ft/bias": ("fasttransformer", dict(bias=True)),
}


def _cfg(key: str):
    name, ov = CONFIGS[key]
    return preset(name, **{**SMALL, **ov})


def _count(cfg, backend_ctx=None):
    """FlopCounterMode over one training forward + backward on CPU."""
    model = build_model(cfg, seed=0).train()
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    fc = FlopCounterMode(display=False)
    ctx = backend_ctx if backend_ctx is not None else torch.enable_grad()
    with ctx, fc:
        _, loss = model(idx, idx)
        loss.backward()
    return fc


@pytest.mark.parametrize("key", sorted(CONFIGS))
def test_flop_counter_matches(key):
    cfg = _cfg(key)
    fc = _count(cfg)
    assert fc.get_total_flops() == flop_counter_flops(cfg, B, T)  # CPU backend, exact
    # per module: the MLP of block 0 is up + down, 3x forward
    counts = fc.get_flop_counts()
    fwd = {r["component"]: r["gemm_flops"] for r in rows(cfg, B, T, capability=None) if r["layer"] == 0
           and r["phase"] == "fwd"}
    assert sum(counts["GPT.blocks.0.mlp"].values()) == 3 * (fwd["mlp_up"] + fwd["mlp_down"])
    assert sum(counts["GPT.blocks.0.attn.qkv"].values()) == 3 * fwd["qkv"]
    assert sum(counts["GPT.head"].values()) == 3 * next(
        r["gemm_flops"] for r in rows(cfg, B, T) if r["component"] == "head" and r["phase"] == "fwd")


@pytest.mark.parametrize("key", ["fasttransformer", "ft/gqa", "ft/expand2", "gpt2/sdpa"])
def test_fused_attention_flops_via_math_backend(key):
    """The CPU fused kernel counts 0, so force the math backend to check QKᵀ and A·V."""
    cfg = _cfg(key)
    assert expected_backend(cfg, capability=None) == "cpu_flash"
    fc = _count(cfg, sdpa_kernel(SDPBackend.MATH))
    assert fc.get_total_flops() == flop_counter_flops(cfg, B, T, backend="math")
    assert flop_counter_flops(cfg, B, T, backend="math") > flop_counter_flops(cfg, B, T)


def test_flop_counter_sdpa_convention():
    """FlopCounterMode's fused-SDPA formulas: full T x T forward, 5 matmuls backward."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q, k = (2, 8, T, 32), (2, 1, T, 32)
    fwd = sdpa_flop_count(q, k, k)
    assert fwd == 2 * (2 * 2 * 8 * T * T * 32)  # causal is ignored
    assert sdpa_backward_flop_count(q, q, k, k) == 2.5 * fwd
    cfg = preset("gpt2", attn_impl="sdpa", **SMALL)
    att = sum(r["gemm_flops"] for r in rows(cfg, B, T) if r["phase"] == "fwd" and r["kind"] == "attention")
    diff = flop_counter_flops(cfg, B, T, backend="flash") - flop_counter_flops(cfg, B, T, backend="math")
    assert diff == pytest.approx(0.5 * att)


@pytest.mark.parametrize("key", sorted(CONFIGS))
def test_num_params(key):
    cfg = _cfg(key)
    assert num_params(cfg) == build_model(cfg).num_params()
    assert sum(r["params"] for r in rows(cfg, B, T)) == num_params(cfg)


def test_true_parameter_counts():
    assert num_params(preset("gpt2")) == 4_837_888
    assert num_params(preset("fasttransformer")) == 2_559_744


class _TTLog(TorchDispatchMode):
    """Count reads and writes of (B, nh, T, T) tensors by non-view ATen ops."""

    VIEWS = {"view", "_unsafe_view", "transpose", "t", "expand", "detach", "unsqueeze", "squeeze",
             "permute", "alias", "as_strided", "slice", "select", "split_with_sizes", "split"}

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.reads, self.writes = numel, 0, 0

    def _n(self, xs) -> int:
        return sum(1 for a in tree_flatten(xs)[0] if isinstance(a, torch.Tensor)
                   and a.numel() == self.numel and tuple(a.shape[-2:]) == (T, T))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ not in self.VIEWS:
            self.reads += self._n((args, kwargs))
            self.writes += self._n(out)
        return out


@pytest.mark.parametrize("key", ["gpt2", "ft/broadcast", "gpt2/gqa2", "fasttransformer"])
def test_attention_matrix_passes(key):
    cfg = _cfg(key)
    model = build_model(cfg, seed=0).train()
    idx = torch.zeros(B, T, dtype=torch.long)
    log = _TTLog(B * cfg.n_head * T * T)
    with log:
        _, loss = model(idx, idx)
        loss.backward()
    tr = attention_matrix_traffic(cfg, B, T, capability=None)
    assert (log.reads, log.writes) == (tr["reads_per_layer"] * cfg.n_layer, tr["writes_per_layer"] * cfg.n_layer)


def test_hand_derived_flop_split():
    g = preset("gpt2")
    bd = layer_forward_breakdown(g, 32, 256)
    assert round(bd["mlp_up"] + bd["mlp_down"], -7) == 8.59e9
    assert round(bd["qkv"], -7) == 3.22e9
    assert round(bd["out_proj"], -7) == 1.07e9
    assert round(bd["scores"] + bd["attn_v"], -7) == 2.15e9
    full = attention_mlp_fractions(g, 32, 256)
    causal = attention_mlp_fractions(g, 32, 256, causal=True)
    assert (round(full["attention"], 3), round(full["mlp"], 3)) == (0.143, 0.571)
    assert (round(causal["attention"], 3), round(causal["mlp"], 3)) == (0.077, 0.615)
    # the post's claims do not hold
    assert abs(full["attention"] - POST_CLAIMED["attention_share"]) > 0.03
    assert abs(full["mlp"] - POST_CLAIMED["mlp_share"]) > 0.05
    # 8.59 -> 4.30 for the 2x MLP does hold
    ft = attention_mlp_fractions(preset("fasttransformer"), 32, 256)
    assert round(ft["mlp_gflop"], 2) == pytest.approx(POST_CLAIMED["mlp_gflop_fasttransformer"], abs=0.011)


def test_hand_derived_step_flops_and_floors():
    g, f = preset("gpt2"), preset("fasttransformer")
    assert round(palm_flops(f, 32, 256) / 1e9) == 160
    assert round(palm_flops(g, 32, 256) / 1e9) == 271
    h200 = lookup("NVIDIA H200")
    assert round(flops_floor(palm_flops(f, 32, 256), h200, "fp32") * 1e3, 1) == 2.4
    assert round(flops_floor(palm_flops(g, 32, 256), h200, "fp32") * 1e3, 1) == 4.1
    assert round(flops_floor(palm_flops(f, 32, 256), h200, "tf32") * 1e3, 2) == 0.32
    assert round(flops_floor(palm_flops(g, 32, 256), h200, "tf32") * 1e3, 2) == 0.55


@pytest.mark.parametrize("key", ["gpt2", "fasttransformer", "gpt2/tied", "ft/gqa", "gpt2/mlp2"])
def test_closed_forms_against_component_sum(key):
    cfg = _cfg(key)
    gemm = total_flops(cfg, 32, T, gemm_only=True)
    # PaLM with N = matmul weights is exactly the full-T x T matmul sum
    assert palm_flops(cfg, 32, T) == pytest.approx(gemm, rel=1e-12)
    # Kaplan: 6N + causal context, without the head
    causal_gemm = sum(r["gemm_flops"] / (2 if r["kind"] == "attention" else 1) for r in rows(cfg, 32, T))
    head = 3 * 2 * 32 * T * cfg.n_embd * cfg.vocab_size
    assert kaplan_flops(cfg, 32, T) == pytest.approx(causal_gemm - head, rel=1e-12)
    megatron = megatron_flops(cfg, 32, T)
    if cfg.mlp_ratio == 4 and cfg.n_kv_head == cfg.n_head:
        assert megatron == pytest.approx(gemm, rel=1e-12)
    else:
        assert megatron > gemm * 1.05  # its fixed 4h MLP / full K,V overcount


def test_megatron_gpt2_full_size():
    g = preset("gpt2")
    assert megatron_flops(g, 32, 256) == pytest.approx(total_flops(g, 32, 256, gemm_only=True), rel=1e-12)


def test_backward_is_twice_forward_for_matmuls():
    for cfg in (preset("gpt2"), preset("fasttransformer")):
        rs = rows(cfg, 8, 64, backend="math")
        fwd = sum(r["gemm_flops"] for r in rs if r["phase"] == "fwd")
        bwd = sum(r["gemm_flops"] for r in rs if r["phase"] == "bwd")
        assert bwd == 2 * fwd


def test_fused_attention_is_causal_with_recompute():
    cfg = preset("fasttransformer")
    rs = {(r["component"], r["phase"]): r for r in rows(cfg, 32, 256, backend="efficient") if r["layer"] == 0}
    full = rs[("scores", "fwd")]["flops_full"]
    assert rs[("scores", "fwd")]["flops"] == full / 2
    assert rs[("scores", "bwd")]["flops"] + rs[("attn_v", "bwd")]["flops"] == 2.5 * full
    assert rs[("softmax", "fwd")]["bytes"] < 1e7  # only the log-sum-exp, no T x T tensor


def test_expected_backend_rules():
    ft = preset("fasttransformer")
    orig = preset("fasttransformer", kv_layout="broadcast")  # the original's (B, 1, T, d) K/V
    assert expected_backend(orig, "fp32", (9, 0)) == "math"  # no fused kernel takes the broadcast K/V in fp32: math
    assert expected_backend(orig, "fp32", (7, 5)) == "math"
    assert expected_backend(ft, "fp32", (9, 0)) == "efficient"  # .expand view -> fmha_cutlass
    assert expected_backend(ft, "bf16", (9, 0)) == "flash"
    assert expected_backend(ft, "fp16", (7, 5)) == "efficient"  # T4 has no flash
    assert expected_backend(ft, "bf16", (7, 5)) == "math"  # no bf16 below sm80
    assert expected_backend(preset("gpt2"), "bf16", (9, 0)) == "explicit"
    assert expected_backend(preset("fasttransformer", n_kv_head=2, kv_layout="gqa"), "fp32", (9, 0)) == "math"
    assert expected_backend(preset("fasttransformer", n_kv_head=2, kv_layout="gqa"), "bf16", (9, 0)) == "flash"


def test_805_mb_claim():
    g = preset("gpt2")
    tr = attention_matrix_traffic(g, 32, 256, "fp32")
    assert round(tr["write_once_read_once_per_step"] / 1e6) == round(POST_CLAIMED["attention_matrix_mb_per_step"])
    assert tr["bytes_per_step"] == 19 * tr["tensor_bytes"] * g.n_layer  # 19 passes per layer, eager
    ft = preset("fasttransformer", kv_layout="broadcast")
    assert attention_matrix_traffic(ft, 32, 256, "fp32")["bytes_per_step"] == 13 * tr["tensor_bytes"] * 6
    assert attention_matrix_traffic(preset("fasttransformer"), 32, 256, "fp32")["bytes_per_step"] == 0


def test_switches_move_the_right_rows():
    base = preset("gpt2")
    r0 = {(r["layer"], r["component"], r["phase"]): r for r in rows(base, 4, 64)}
    mqa = {(r["layer"], r["component"], r["phase"]): r for r in rows(base.replace(n_kv_head=1), 4, 64)}
    assert mqa[(0, "qkv", "fwd")]["gemm_flops"] == r0[(0, "qkv", "fwd")]["gemm_flops"] * 320 / 768
    bf = {(r["layer"], r["component"], r["phase"]): r for r in rows(base, 4, 64, precision="bf16")}
    assert bf[(0, "mlp_up", "fwd")]["bytes"] == r0[(0, "mlp_up", "fwd")]["bytes"] / 2
    rms = {(r["layer"], r["component"], r["phase"]): r for r in rows(base.replace(norm="rmsnorm"), 4, 64)}
    assert rms[(0, "norm1", "fwd")]["flops"] < r0[(0, "norm1", "fwd")]["flops"]
    assert rms[(0, "norm1", "fwd")]["params"] == base.n_embd
    s = step_summary(base, 32, 256)
    assert s["saved_activation_bytes"] > attention_matrix_traffic(base, 32, 256)["saved_bytes_per_step"]


def test_peaks_and_roofline():
    assert lookup("Tesla T4").tf32 is None and lookup("Tesla T4").sms == 40
    assert lookup("NVIDIA A100-SXM4-80GB") is lookup("A100")
    assert lookup("NVIDIA H200 NVL").name == "NVIDIA H200 NVL"
    assert lookup("NVIDIA H200").bandwidth_gbs == 4800 and lookup("NVIDIA H200").l2_mb == 50
    assert lookup("NVIDIA H100 80GB HBM3").capability == (9, 0)
    assert all(p.source for p in PEAKS.values())
    with pytest.raises(KeyError):
        lookup("Voodoo2")
    with pytest.raises(ValueError):
        step_floor(preset("gpt2"), 32, 256, "Tesla T4", "tf32")
    rf = roofline(preset("gpt2"), 32, 256, "NVIDIA H200", "fp32")
    assert all(r["floor_s"] == max(r["compute_s"], r["memory_s"]) for r in rf)
    assert {r["bound"] for r in rf if r["component"] == "softmax"} == {"memory"}
    sf = step_floor(preset("gpt2"), 32, 256, "NVIDIA H200", "fp32")
    assert sf["floor_s"] >= max(sf["compute_s"], sf["memory_s"]) - 1e-12
    a = achieved(67e12 * 1e-3, 4.8e12 * 1e-3, 2e-3, "NVIDIA H200", "fp32")
    assert math.isclose(a["mfu"], 0.5) and math.isclose(a["bandwidth_utilization"], 0.5)


def test_attention_dropout_zero_drops_only_the_probability_passes():
    from ftlib.analysis.backends import attention_matrix_traffic
    from ftlib.model.config import preset as _preset

    both = _preset("gpt2", dropout=0.1)
    resid_only = both.replace(attn_dropout=0.0)
    none = both.replace(dropout=0.0)
    t = {k: attention_matrix_traffic(c, 4, 64, "fp32", backend="math", training=True)
         for k, c in (("both", both), ("resid", resid_only), ("none", none))}
    assert t["resid"] == t["none"] != t["both"]


def test_chapter2_shares_text_computes_its_ratio_to_the_post(monkeypatch):
    from ftlib.analysis.claims import POST_CLAIMED
    from ftlib.analysis.totals import attention_mlp_fractions
    from ftlib.views import accounting as av

    full = attention_mlp_fractions(preset("gpt2"), 32, 256)
    ratio = full["attention"] / POST_CLAIMED["attention_share"]
    assert f"{ratio:.1f} times the" in av.shares_text()
    monkeypatch.setitem(POST_CLAIMED, "attention_share", 2 * POST_CLAIMED["attention_share"])
    assert f"{ratio / 2:.1f} times the" in av.shares_text()


def test_gpt2_attention_on_the_books_kernels_counts_p_written_once_and_read_once():
    """'explicit_fused' (the engine's fuse_softmax_matmuls): causal tiles, q, k, v by index, and of the
    (B, nh, T, T) tensors only P, written once forward and read once backward: the least any kernel that
    stores P can move, below what PyTorch's explicit ops move and above a flash kernel's."""
    cfg = preset("gpt2", **SMALL)
    s, nh, hs, layers = 2, cfg.n_head, cfg.head_size, cfg.n_layer  # bf16

    def attention(backend, b=B, t=T):
        rs = [r for r in rows(cfg, b, t, precision="bf16", backend=backend)
              if r["component"] in ("scores", "softmax", "attn_v")]
        return sum(r["bytes"] for r in rs), sum(r["flops"] for r in rs if r["kind"] == "attention")

    fused_bytes, fused_flops = attention("explicit_fused")
    flash_bytes, flash_flops = attention("flash")
    explicit_bytes, _ = attention("explicit")
    passes = tt_passes("explicit_fused", dropout=False)
    assert [(p[0], p[3], p[4]) for p in passes] == [("fwd", 0, 1), ("bwd", 1, 0)]  # P: written once, read once
    assert attention_matrix_traffic(cfg, B, T, "bf16", backend="explicit_fused")["bytes_per_step"] == \
        layers * 2 * B * nh * T * T * s
    assert fused_bytes < explicit_bytes
    # At the headline shape P's bytes outweigh what flash saves and reads back instead (O, the log-sum-exp).
    assert attention("flash", 32, 256)[0] < attention("explicit_fused", 32, 256)[0] < attention("explicit", 32, 256)[0]
    # Causal products only, none recomputed: q kᵀ and P v forward, dV, dP, dQ, dK backward (6 halves).
    assert fused_flops == layers * 6 * B * nh * T * T * hs
    assert flash_flops == layers * 7 * B * nh * T * T * hs  # flash recomputes q kᵀ backward


def test_the_ledger_accounts_the_engines_explicit_attention_as_explicit_fused():
    from ftlib.views.ledger import attention_backend

    cfg = preset("gpt2")
    assert attention_backend({"precision": "bf16", "describe": {"fuse_softmax_matmuls": True, "kernels": []}},
                             cfg, (9, 0)) == "explicit_fused"
    assert attention_backend({"precision": "bf16", "describe": {"fuse_softmax_matmuls": False, "kernels": []}},
                             cfg, (9, 0)) == "explicit"
    assert attention_backend({"precision": "bf16", "describe": {"kernels": ["attention"]}}, cfg, (9, 0)) == "flash"


def test_intensity_figure_names_the_markers_drawn_on_top_of_one_another():
    """norm1 and norm2 have the same FLOPs and bytes, so one marker hides the other; the subtitle says so, and a
    pair set apart by more than the threshold is not named."""
    import pandas as pd

    from ftlib.views import accounting as av

    pts = {"a": pd.DataFrame({"flops": [1e9, 1e9, 1.05e9, 5e9], "bytes": [1e8, 1e8, 1e8, 1e8]},
                             index=["norm1", "norm2", "gelu", "qkv"]),
           "b": pd.DataFrame({"flops": [1e9, 1e9], "bytes": [1e8, 2e8]}, index=["norm1", "norm2"])}
    assert av.coincident(pts) == [(["norm1", "norm2", "gelu"], ["a"])]
    assert av.coincident(pts, decades=0.01) == [(["norm1", "norm2"], ["a"])]
    title = av.intensity_figure().layout.title.text
    assert "norm1 and norm2 (GPT-2 and FT, original K/V)" in title and "mlp_up and mlp_down (FT, original K/V)" in title
