"""Dynamic loss scaling: the config, train_step's GradScaler order, the device scaler, the flat
AdamW kernel's unscale-and-skip, and the trainer's fp16 runs."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported, so this file runs alone too

import math

import pytest
import torch

from ftlib.model.config import preset
from ftlib.model.gpt import build_model
from ftlib.model.reference import adamw_step_ref
from ftlib.training.loss_scale import DeviceLossScale, LossScaleConfig, make_grad_scaler
from ftlib.training.step import grad_scaler, make_optimizer, train_step

TINY = preset("fasttransformer", n_layer=1, n_embd=32, n_head=4, n_kv_head=1, block_size=8)


@pytest.mark.parametrize("kwargs,match", [
    ({"init_scale": 0.0}, "init_scale"), ({"init_scale": math.inf}, "init_scale"),
    ({"growth_factor": 1.0}, "growth_factor"), ({"backoff_factor": 1.0}, "backoff_factor"),
    ({"growth_interval": 0}, "growth_interval"), ({"growth_interval": 2.5}, "growth_interval"),
])
def test_config_is_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LossScaleConfig(**kwargs)


def test_grad_scaler_only_for_fp16():
    sc = grad_scaler("fp16", "cpu", LossScaleConfig(init_scale=256.0))
    assert isinstance(sc, torch.amp.GradScaler) and sc.get_scale() == 256.0
    assert all(grad_scaler(p, "cpu") is None for p in ("fp32", "tf32", "bf16"))
    assert make_grad_scaler("fp16", "cpu").get_scale() == 2.0**16
    with pytest.raises(ValueError, match="unknown precision"):
        grad_scaler("fp8", "cpu")


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 65, (2, 8), generator=g), torch.randint(0, 65, (2, 8), generator=g)


def test_train_step_unscales_before_clipping():
    # In fp32 a power-of-two loss scale is exact, so scaled training must equal unscaled training
    # bit for bit, and only if the clip sees unscaled gradients (the clip is active here).
    x, y = _batch()
    plain, scaled = build_model(TINY, seed=1), build_model(TINY, seed=1)
    o1, o2 = make_optimizer(plain), make_optimizer(scaled)
    sc = grad_scaler("fp16", "cpu")
    for _ in range(3):
        a = train_step(plain, o1, x, y, grad_clip=0.05)
        b = train_step(scaled, o2, x, y, grad_clip=0.05, scaler=sc)
        assert torch.equal(a, b)
    for (n, p), q in zip(plain.named_parameters(), scaled.parameters()):
        assert torch.equal(p, q), n


def test_train_step_skips_an_inf_step_and_halves_the_scale():
    x, y = _batch(1)
    model = build_model(TINY, seed=2)
    opt = make_optimizer(model)
    sc = grad_scaler("fp16", "cpu")
    train_step(model, opt, x, y, grad_clip=1.0, autocast_dtype=torch.float16, scaler=sc)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    steps = [s["step"].item() for s in opt.state.values()]
    h = model.head.weight.register_hook(lambda g: torch.full_like(g, math.inf))
    train_step(model, opt, x, y, grad_clip=1.0, autocast_dtype=torch.float16, scaler=sc)
    h.remove()
    assert sc.get_scale() == 2.0**15
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert [s["step"].item() for s in opt.state.values()] == steps


def test_device_scale_grows_and_backs_off_like_grad_scaler():
    ls = DeviceLossScale("cpu", LossScaleConfig(init_scale=8.0, growth_interval=2))
    got = []
    for inf in (0, 0, 1, 0, 0, 0):
        ls.found_inf.fill_(inf)
        ls.update_()
        got.append((float(ls.scale), int(ls.growth_tracker)))
    assert got == [(8.0, 1), (16.0, 0), (8.0, 0), (8.0, 1), (16.0, 0), (16.0, 1)]
    ls.reset_()
    assert ls.state() == {"scale": 8.0, "growth_tracker": 0, "found_inf": 0.0}


@pytest.mark.parametrize("clip", [None, 0.01, 1e6], ids=["no-clip", "clip-active", "clip-idle"])
def test_unscale_factor_is_grad_scalers_unscale_then_clip(clip):
    g = torch.randn(1000, generator=torch.Generator().manual_seed(3)) * 2.0**12
    ls = DeviceLossScale("cpu", LossScaleConfig(init_scale=2.0**12))
    ls.unscale_factor_(g, clip)
    # torch's order: grads * (1/S) (GradScaler.unscale_), then clip_grad_norm_ on the result.
    p = torch.nn.Parameter(torch.zeros(1000))
    p.grad = g.clone() * ls.scale.double().reciprocal().float()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_([p], clip)
    torch.testing.assert_close(g * ls.grad_mul, p.grad, rtol=1e-6, atol=0)
    assert float(ls.found_inf) == 0.0 and ls.step_increment().item() == 1.0
    for bad in (math.inf, math.nan):
        g2 = g.clone()
        g2[17] = bad
        ls.unscale_factor_(g2, clip)
        assert float(ls.found_inf) == 1.0 and ls.step_increment().item() == 0.0


def _flat_adamw_state(n=3000, seed=0):
    g = torch.Generator().manual_seed(seed)
    p, grad = torch.randn(n, generator=g), torch.randn(n, generator=g) * 1024
    m, v = torch.randn(n, generator=g) * 0.1, torch.rand(n, generator=g) * 0.01
    return p, grad, m, v


def test_adamw_kernel_unscales_with_grad_mul():
    from kernels.adamw import adamw_step_

    p, g, m, v = _flat_adamw_state()
    mul = torch.tensor(1 / 1024 * 0.5)  # 1/S times a clip coefficient
    step, lr = torch.tensor(3.0), torch.tensor(1e-3)
    p2, m2, v2 = p.clone(), m.clone(), v.clone()
    adamw_step_(p, g, m, v, step, lr, n_decay=1000, grad_scaling=(mul, torch.tensor(0.0)))
    adamw_step_ref(p2, g * mul, m2, v2, step=3, lr=1e-3, n_decay=1000)
    for a, b in ((p, p2), (m, m2), (v, v2)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_adamw_kernel_skips_everything_when_found_inf():
    from kernels.adamw import adamw_step_

    p, g, m, v = _flat_adamw_state(seed=1)
    g[5] = math.inf
    before = [t.clone() for t in (p, m, v)]
    adamw_step_(p, g, m, v, torch.tensor(1.0), torch.tensor(1e-3), grad_scaling=(torch.tensor(1.0), torch.tensor(1.0)))
    assert all(torch.equal(a, b) for a, b in zip((p, m, v), before))
    with pytest.raises(TypeError, match="grad_mul"):
        adamw_step_(p, g, m, v, torch.tensor(1.0), torch.tensor(1e-3),
                    grad_scaling=(torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.0)))
    with pytest.raises(ValueError, match="found_inf"):
        adamw_step_(p, g, m, v, torch.tensor(1.0), torch.tensor(1e-3), grad_scaling=(torch.tensor(1.0), torch.zeros(2)))


@pytest.mark.parametrize("engine", [False, True], ids=["train_step", "engine"])
def test_trainer_scales_fp16_runs(engine):
    from ftlib.training.data import load_tinyshakespeare
    from ftlib.training.trainer import Recipe, train

    ds = load_tinyshakespeare(download=False)
    rec = Recipe(steps=4, batch_size=2, block_size=16, precision="fp16", eval_interval=4, eval_iters=1,
                 engine=engine)
    out = train(preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=16), rec, ds,
                progress=False)
    assert out["loss_scale"]["scale"] == 2.0**16 and math.isfinite(out["history"][-1]["val_loss"])
    assert out["loss_scale"]["scaler"] == ("device (flat AdamW skips)" if engine else "torch.amp.GradScaler")
    fp32 = train(preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=16),
                 rec.replace(precision="fp32"), ds, progress=False)
    assert fp32["loss_scale"] is None


def test_cross_entropy_kernel_backward_takes_a_loss_scale_beyond_fp16s_range():
    # The engine's loss under fp16 autocast: fp16 logits, the backward seeded with S = 2^16,
    # which is not an fp16 number (max 65504). The gradient must be dlogits * S, rounded once.
    from kernels.cross_entropy import cross_entropy

    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(64, 65, generator=g) * 3).half().requires_grad_(True)
    targets = torch.randint(0, 65, (64,), generator=g)
    loss = cross_entropy(logits, targets)
    (grad,) = torch.autograd.grad(loss * torch.tensor(2.0**16), logits)
    x32 = logits.detach().float().requires_grad_(True)
    (ref_grad,) = torch.autograd.grad(torch.nn.functional.cross_entropy(x32, targets) * 2.0**16, x32)
    assert torch.isfinite(grad).all() and grad.dtype == torch.float16
    torch.testing.assert_close(grad.float(), ref_grad.half().float(), rtol=2e-3, atol=1e-2)
