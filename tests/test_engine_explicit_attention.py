"""The engine's paths for GPT-2's explicit attention kept as written: ``fused_softmax`` (scale, mask and softmax
in one kernel each way, kernels/causal_softmax.py; a default) and ``fuse_softmax_matmuls`` (the products with K
and V fused with the softmax too, the probabilities still written, kernels/explicit_attention.py). Each trains
as the path before it, parameter names do not change, and where one does not apply (SDPA models, attention
dropout, the attention kernel swapped in, a head size the kernels do not take) a note says why."""

from __future__ import annotations

import pytest
import torch
from gpu_breadth import case
from kernel_tolerance import TF32_GRAD_RTOL, flat_grad_errors
from small_engines import B, T
from small_engines import engine as _build
from small_engines import train as _train

from ftlib.harness.engine_check import check_against_reference
from ftlib.model.config import preset
from ftlib.model.gpt import build_model
from ftlib.training.engine import Engine, EngineOptions

pytest.importorskip("triton")
pytestmark = pytest.mark.usefixtures("results_root")  # results under tmp_path (conftest)

GPT2 = preset("gpt2", n_layer=2, n_embd=64, n_head=4, n_kv_head=4, block_size=T)
GPT2_MQA = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T)  # the explicit grid's MQA cell
GPT_MHA = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=T)
FT_MQA = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T)


def test_fused_softmax_only_for_explicit_attention_left_as_written(kernel_device):
    gpt = Engine(GPT_MHA, B, T, "fp32", kernel_device, fused_softmax=True)
    assert type(gpt.model.blocks[0].attn).__name__ == "FusedSoftmaxSelfAttention"
    assert gpt.describe()["fused_softmax"] and "causal_softmax" in gpt.notes["softmax"]
    assert [n for n, _ in gpt.model.named_parameters()] == [n for n, _ in build_model(GPT_MHA).named_parameters()]
    # The attention kernel replaces the whole attention where it is asked for; SDPA models have no softmax.
    flash = Engine(GPT_MHA, B, T, "fp32", kernel_device, fused_softmax=True, attention_for_explicit=True)
    assert flash.kernels["attention"] and "softmax" not in flash.notes and not flash.describe()["fused_softmax"]
    assert not Engine(FT_MQA, B, T, "fp32", kernel_device, fused_softmax=True).describe()["fused_softmax"]
    off = Engine(GPT_MHA, B, T, "fp32", kernel_device, use_kernels=False, fused_softmax=True)
    assert "switched off" in off.notes["softmax"] and not off.describe()["fused_softmax"]
    assert Engine(GPT_MHA, B, T, "fp32", kernel_device).describe()["fused_softmax"]  # on by default
    assert not Engine(GPT_MHA, B, T, "fp32", kernel_device, fused_softmax=False).describe()["fused_softmax"]


def test_fused_softmax_under_bf16_writes_bf16_probabilities_and_stays_close(kernel_device):
    alone = {"fused_softmax": True, "fuse_softmax_matmuls": False}  # the softmax's kernel, the products on cuBLAS
    eng = Engine(GPT_MHA, B, T, "bf16", kernel_device, **alone)
    assert eng.model.blocks[0].attn.out_dtype == torch.bfloat16
    r = check_against_reference(GPT_MHA, steps=2, device=kernel_device, precision="bf16", B=B, T=T, **alone)
    assert r["ok"] and r["fused_softmax"], r["max_rel_err"]


# Each precision once and each model twice; fp16 (bf16's paths in another dtype) only compiled (tests/gpu_breadth.py).
@pytest.mark.parametrize("cfg,precision,tol", [pytest.param(GPT2, "bf16", 3e-2, id="gpt2-bf16"),
                                               pytest.param(GPT2, "fp32", 1e-4, id="gpt2-fp32"),
                                               pytest.param(GPT2_MQA, "tf32", 1e-4, id="gpt2-mqa-tf32"),
                                               case(GPT2_MQA, "fp16", 1e-2, id="gpt2-mqa-fp16")])
def test_the_fused_attention_trains_like_the_fused_softmax(kernel_device, cfg, precision, tol):
    from ftlib.training.engine.attention import FusedExplicitSelfAttention, FusedSoftmaxSelfAttention

    # In strict fp32 the option applies only with a dot precision set ('ieee': the same arithmetic as the default).
    dots = {"attention_precision": "ieee"} if precision == "fp32" else {}
    on, losses_on = _train(cfg, precision, kernel_device, **dots)  # the default
    off, losses_off = _train(cfg, precision, kernel_device, fuse_softmax_matmuls=False, **dots)
    assert all(type(blk.attn) is FusedExplicitSelfAttention for blk in on.model.blocks)
    assert all(type(blk.attn) is FusedSoftmaxSelfAttention for blk in off.model.blocks)
    d_on, d_off = on.describe(), off.describe()
    assert d_on["fuse_softmax_matmuls"] and d_on["fused_softmax"] and not d_off["fuse_softmax_matmuls"]
    assert "probabilities still written" in d_on["notes"]["softmax"]
    assert on.model.blocks[0].attn.core.p_dtype == (torch.bfloat16 if precision == "bf16" else None)
    assert [n for n, _ in on.model.named_parameters()] == [n for n, _ in off.model.named_parameters()]
    torch.testing.assert_close(losses_on, losses_off, rtol=tol, atol=tol)
    assert torch.isfinite(losses_on).all()
    for name, err in flat_grad_errors(on, off).items():  # the last step's gradients, parameter by parameter
        # In tf32 the two sides' products are rounded by different kernels (cuBLAS, tl.dot): TF32's own bound.
        assert err < (TF32_GRAD_RTOL if precision == "tf32" else 10 * tol), (name, err)


def test_where_it_does_not_apply_the_note_says_why(kernel_device):
    """The engine decides each path when it is built: its notes and attention modules, read before any step."""
    from ftlib.training.engine.attention import FusedSoftmaxSelfAttention, KernelCausalSelfAttention

    dropout = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=T, attn_dropout=0.1)
    eng = _build(dropout, "fp32", kernel_device, fuse_softmax_matmuls=True)
    assert type(eng.model.blocks[0].attn) is FusedSoftmaxSelfAttention
    assert "no attention dropout" in eng.describe()["notes"]["softmax"] and not eng.describe()["fuse_softmax_matmuls"]
    eng = _build(dropout, "fp32", kernel_device, fuse_softmax_matmuls=True, fused_softmax=False)
    assert eng.describe()["notes"]["softmax"].startswith("not fused")
    big = preset("gpt2", n_layer=1, n_embd=96, n_head=2, n_kv_head=2, block_size=T)  # head size 48
    eng = _build(big, "fp32", kernel_device, fuse_softmax_matmuls=True)
    assert "head size 48" in eng.describe()["notes"]["softmax"]
    eng = _build(GPT2, "fp32", kernel_device, fuse_softmax_matmuls=True, attention_for_explicit=True)
    assert type(eng.model.blocks[0].attn) is KernelCausalSelfAttention  # the flash kernel took it
    assert not eng.describe()["fuse_softmax_matmuls"]
    assert EngineOptions().fuse_softmax_matmuls is True  # it won its trial in bf16 and tf32: a default
    # Strict fp32 keeps cuBLAS's products around the fused softmax (not measured faster there) unless asked.
    eng = _build(GPT2, "fp32", kernel_device)
    assert type(eng.model.blocks[0].attn) is FusedSoftmaxSelfAttention and not eng.describe()["fuse_softmax_matmuls"]
    assert "not applied in strict fp32" in eng.describe()["notes"]["softmax"]
    eng = _build(GPT2, "fp32", kernel_device, attention_precision="tf32x3")
    assert eng.describe()["fuse_softmax_matmuls"] and eng.model.blocks[0].attn.core.input_precision == "tf32x3"


# Each option with each model and precision; in the interpreter each option once, on a model of its own.
@pytest.mark.parametrize("cfg,precision,tol,option", [
    pytest.param(GPT2_MQA, "bf16", 3e-2, "explicit_one_pass", id="mqa-bf16-explicit_one_pass"),
    case(GPT2, "tf32", 1e-4, "explicit_one_pass", id="tf32-explicit_one_pass"),
    case(GPT2_MQA, "bf16", 3e-2, "explicit_dq_one_pass", id="mqa-bf16-explicit_dq_one_pass"),
    pytest.param(GPT2, "tf32", 1e-4, "explicit_dq_one_pass", id="tf32-explicit_dq_one_pass")])
def test_one_pass_trains_like_the_two_passes(kernel_device, cfg, precision, tol, option):
    """Options explicit_one_pass (the forward and dQ kernels) and explicit_dq_one_pass (the dQ kernel alone, at
    64 query rows on 4 warps; a default since it won its trial): the same losses and gradients as the two-pass
    kernels (a default's reach), the note and the description say so."""
    from ftlib.training.engine.swaps import dq_one_pass_tiles

    assert EngineOptions().explicit_dq_one_pass is True and EngineOptions().explicit_one_pass is False
    on_kw = {"explicit_one_pass": True, "explicit_dq_one_pass": False} if option == "explicit_one_pass" else {}
    on, losses_on = _train(cfg, precision, kernel_device, **on_kw)
    off, losses_off = _train(cfg, precision, kernel_device, explicit_dq_one_pass=False)
    fwd, dq = ((True, True) if option == "explicit_one_pass" else
               (False, dq_one_pass_tiles(cfg.block_size)))
    assert all(blk.attn.core.fwd_one_pass == fwd and blk.attn.core.dq_one_pass == dq for blk in on.model.blocks)
    assert not any(blk.attn.core.fwd_one_pass or blk.attn.core.dq_one_pass for blk in off.model.blocks)
    assert f"one pass over each row ({option})" in on.describe()["notes"]["softmax"]
    assert on.describe()[option] is True and not any(off.describe()[n] for n in ("explicit_one_pass",
                                                                               "explicit_dq_one_pass"))
    torch.testing.assert_close(losses_on, losses_off, rtol=tol, atol=tol)
    for name, err in flat_grad_errors(on, off).items():
        assert err < 10 * tol, name


def test_one_pass_where_it_does_not_apply(kernel_device):
    with pytest.raises(ValueError, match="names 'fwd' tiles"):
        EngineOptions(explicit_one_pass=True, attention_tiles="fwd 64x64 w4 s2")
    EngineOptions(explicit_one_pass=True, attention_tiles="bwd 32x32 w4 s2")  # the dK/dV kernel's: allowed
    long = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=1024)
    eng = Engine(long, B, T, "tf32", kernel_device, capture=False, explicit_one_pass=True, explicit_dq_one_pass=True)
    assert not (eng.model.blocks[0].attn.core.fwd_one_pass or eng.model.blocks[0].attn.core.dq_one_pass)
    assert "explicit_one_pass and explicit_dq_one_pass not applied" in eng.describe()["notes"]["softmax"]


def test_dq_one_pass_is_not_applied_below_sm_80():
    """The dQ option's 64-row tile of fp32 scores needs more shared memory than a T4's block has (the compile
    test measures it): on sm_75 the two-pass dQ kernel stays, and the note says why."""
    from ftlib.core.device import DeviceInfo
    from ftlib.training.engine.swaps import _explicit_one_pass

    t4, h200 = (DeviceInfo(name=n, kind="cuda", capability=cap) for n, cap in (("T4", (7, 5)), ("H200", (9, 0))))
    opts = EngineOptions(explicit_dq_one_pass=True)
    fwd, dq, note = _explicit_one_pass(GPT2, opts, t4)
    assert (fwd, dq) == (False, False) and "explicit_dq_one_pass not applied" in note and "sm_80" in note
    fwd, dq, note = _explicit_one_pass(GPT2, opts, h200)
    assert fwd is False and dq.block_m == 64 and dq.num_warps == 4 and dq.block_n >= GPT2.block_size
    # With both options on a T4 the forward's stays, and the dQ kernel takes the forward option's tiles.
    fwd, dq, note = _explicit_one_pass(GPT2, EngineOptions(explicit_one_pass=True, explicit_dq_one_pass=True), t4)
    assert fwd is True and dq is True and "(explicit_one_pass)" in note and "explicit_dq_one_pass not applied" in note
