"""The engine in fp16 (dynamic loss scaling on the device) and on a T4's description (what it
keeps on PyTorch's SDPA and cuBLAS), against train_step + torch.optim.AdamW + GradScaler."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported, so this file runs alone too

import math

import pytest
import torch

from ftlib.core.device import ENV_CAPABILITY, DeviceInfo
from ftlib.core.precision import precision_region as precision
from ftlib.harness.engine_check import check_against_reference, pattern_batches
from ftlib.model.config import preset
from ftlib.model.gpt import build_model
from ftlib.training.engine import Engine
from ftlib.training.loss_scale import LossScaleConfig
from ftlib.training.step import grad_scaler, make_optimizer, train_step

B, T = 1, 16
FT1 = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T)
GPT4 = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=T)
# fp16 on the CPU: the kernels round their fp16 outputs where torch's ops keep some in fp32
# (measured ~1e-5 on the losses and ~1e-4 on the weights over 4 steps); a missing or doubled
# unscale, or an unskipped inf step, is off by orders of magnitude more.
LOSS_RTOL, PARAM_RTOL = 1e-3, 1e-3
T4 = DeviceInfo.for_capability("7.5")


@pytest.fixture(autouse=True)
def no_override(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_CAPABILITY, raising=False)
    monkeypatch.setenv("FTLIB_RESULTS_DIR", str(tmp_path / "results"))


@pytest.mark.parametrize("cfg,use_kernels", [(FT1, True), (GPT4, True), (FT1, False)],
                         ids=["ft-kernels", "gpt2-kernels", "ft-no-kernels"])
def test_fp16_engine_trains_like_grad_scaler_reference(cfg, use_kernels):
    r = check_against_reference(cfg, steps=4, device="cpu", precision="fp16", B=B, T=T, use_kernels=use_kernels,
                                grad_clip=1.0)
    assert r["ok"] and r["max_rel_err"] <= LOSS_RTOL, r["max_rel_err"]
    assert r["param_rel_err"] <= PARAM_RTOL, r["param_rel_err"]
    assert r["loss_scale"] == ("device" if use_kernels else "torch.amp.GradScaler")
    assert r["loss_scale_engine"] == r["loss_scale_ref"] == 2.0**16


def _flat_moments(eng: Engine) -> list[torch.Tensor]:
    o = eng.optimizer
    if o.torch_adamw is None:
        return [o.exp_avg.clone(), o.exp_avg_sq.clone(), o.step_t.clone()]
    return [v.clone() for s in o.torch_adamw.state.values() for v in s.values()]


@pytest.mark.parametrize("use_kernels", [True, False], ids=["flat-adamw-kernel", "torch-adamw"])
def test_inf_gradient_skips_the_step_and_halves_the_scale_in_both(use_kernels):
    cfg, steps, bad_step = FT1, 5, 1
    cfgs = LossScaleConfig(growth_interval=2)  # so the scale also grows within the run
    batches = pattern_batches(cfg.vocab_size, B, T, steps, seed=3)
    ref = build_model(cfg, seed=0)
    opt = make_optimizer(ref)
    scaler = grad_scaler("fp16", "cpu", cfgs)
    # fuse_embedding off: its kernel adds the embeddings' gradients into the flat buffer, past autograd's hooks.
    eng = Engine(cfg, B, T, "fp16", "cpu", use_kernels=use_kernels, seed=0, grad_clip=1.0, loss_scale=cfgs,
                 fuse_embedding=False)
    inject = {"on": False}
    # An inf gradient of one weight, at bad_step only: the token embedding's, which autograd hands to the
    # hook (the Linear weights' gradients go straight into the flat buffer: grad_into_buffer).
    for p in (ref.wte.weight, eng.model.wte.weight):
        p.register_hook(lambda g: torch.full_like(g, math.inf) if inject["on"] else g)
    scales_ref, scales_eng = [], []
    for i, (x, y) in enumerate(batches):
        inject["on"] = i == bad_step
        ref_w = [p.detach().clone() for p in ref.parameters()]
        eng_w, eng_m = eng.flat_param.clone(), _flat_moments(eng)
        ref_m = [v.clone() for s in opt.state.values() for v in s.values()]
        with precision("fp16", "cpu"):
            lr_ = float(train_step(ref, opt, x, y, grad_clip=1.0, scaler=scaler))
        le = float(eng.step(x, y))
        assert le == pytest.approx(lr_, rel=LOSS_RTOL)
        if i == bad_step:  # nothing moved: weights, moments, step counts
            assert all(torch.equal(p, w) for p, w in zip(ref.parameters(), ref_w))
            assert all(torch.equal(a, b) for a, b in zip((v for s in opt.state.values() for v in s.values()), ref_m))
            assert torch.equal(eng.flat_param, eng_w)
            assert all(torch.equal(a, b) for a, b in zip(_flat_moments(eng), eng_m))
        else:
            assert not torch.equal(eng.flat_param, eng_w)
        scales_ref.append(scaler.get_scale())
        scales_eng.append(eng.loss_scale_state()["scale"])
    # 2^16, halved by the inf step, then doubled after two clean steps: GradScaler's rule in both.
    assert scales_ref == scales_eng == [2.0**16, 2.0**15, 2.0**15, 2.0**16, 2.0**16]
    w_ref = torch.cat([p.detach().reshape(-1) for p in eng.model.parameters()])
    w_refm = torch.cat([dict(ref.named_parameters())[n].detach().reshape(-1) for n, _ in eng.model.named_parameters()])
    assert float((w_ref - w_refm).norm() / w_refm.norm()) <= PARAM_RTOL


def test_warm_up_also_resets_the_loss_scale():
    batches = pattern_batches(FT1.vocab_size, B, T, 2, seed=4)
    plain = Engine(FT1, B, T, "fp16", "cpu")
    warmed = Engine(FT1, B, T, "fp16", "cpu")
    warmed.optimizer.loss_scale.scale.fill_(8.0)  # as if the warm-up steps had backed off
    warmed._warm_up(1)
    assert warmed.loss_scale_state() == plain.loss_scale_state()
    for x, y in batches:
        assert torch.equal(warmed.step(x, y), plain.step(x, y))


def test_loss_scale_option_is_for_fp16_only():
    with pytest.raises(ValueError, match="loss_scale is for precision='fp16'"):
        Engine(FT1, B, T, "bf16", "cpu", loss_scale=LossScaleConfig())
    eng = Engine(FT1, B, T, "bf16", "cpu")
    assert eng.loss_scale_state() is None and eng.describe()["loss_scale"] is None


# -- a T4's description: precisions it cannot run are refused, Triton matmuls stay off ------------

@pytest.mark.parametrize("prec", ["tf32", "bf16"])
def test_engine_refuses_precisions_a_t4_cannot_run(prec):
    with pytest.raises(ValueError, match=rf"precision='{prec}' on Tesla T4 \(sm_75\).*sm_80"):
        Engine(FT1, B, T, prec, "cpu", device_info=T4)


def test_on_a_t4_attention_and_the_gemm_stay_on_sdpa_and_cublas():
    eng = Engine(FT1, B, T, "fp16", "cpu", device_info=T4)
    assert not eng.kernels["attention"] and "no tensor cores for fp16" in eng.notes["attention"]
    assert "SDPA kept" in eng.notes["attention"]
    assert eng.kernels["rmsnorm"] and eng.kernels["adamw"]  # no tl.dot: they run as anywhere
    x3 = Engine(FT1, B, T, "fp32", "cpu", device_info=T4, attention_precision="tf32x3", linear_precision="tf32x3")
    assert not x3.kernels["attention"] and "tf32x3" in x3.notes["attention"]
    assert "cuBLAS kept" in x3.notes["linear"]
    # 'ieee' asks for FMA arithmetic explicitly: allowed anywhere.
    ieee = Engine(FT1, B, T, "fp32", "cpu", device_info=T4, attention_precision="ieee")
    assert ieee.kernels["attention"]
    # GPT-2's explicit softmax falls back to the fused softmax kernel (no tl.dot) on a T4.
    gpt = Engine(GPT4, B, T, "fp16", "cpu", device_info=T4, attention_for_explicit=True)
    assert not gpt.kernels["attention"] and gpt.describe()["fused_softmax"]
    assert "Tesla T4" in gpt.describe()["device_info"]


def test_sm80_description_keeps_the_kernels():
    a100 = Engine(FT1, B, T, "fp16", "cpu", device_info=DeviceInfo.for_capability("8.0"))
    assert a100.kernels["attention"] and a100.describe()["loss_scale"] == "device"


def test_override_rehearses_a_t4_on_this_machine(monkeypatch):
    monkeypatch.setenv(ENV_CAPABILITY, "7.5")
    eng = Engine(FT1, B, T, "fp16", "cpu")
    assert eng.device_info.rehearsal and not eng.kernels["attention"]
    assert eng.describe()["device_info"] == "Tesla T4 (sm_75) (rehearsal)"
    with pytest.raises(ValueError, match="bf16"):
        Engine(FT1, B, T, "bf16", "cpu")
