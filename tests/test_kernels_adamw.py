"""Fused flat-buffer AdamW kernel vs ftlib.model.reference.adamw_step_ref vs torch.optim.AdamW, on kernel_device
(tests/conftest.py: the CPU interpreter, or compiled on CUDA with FTLIB_TEST_GPU=1); references on the CPU."""

import pytest
import torch

pytest.importorskip("triton")

from ftlib.model.reference import adamw_step_ref  # noqa: E402
from kernels.adamw import FlatAdamW, adamw_step_  # noqa: E402

pytestmark = pytest.mark.kernels

HP = dict(lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def _state(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.randn(n, generator=g)
    grads = [torch.randn(n, generator=g) * 0.1 for _ in range(6)]
    return p, grads


def _torch_adamw(p0, grads, n_decay, hp, steps):
    """torch.optim.AdamW with a decay and a no-decay group (views of one tensor's halves)."""
    a = p0[:n_decay].clone().requires_grad_(True)
    b = p0[n_decay:].clone().requires_grad_(True)
    opt = torch.optim.AdamW(
        [{"params": [a], "weight_decay": hp["weight_decay"]}, {"params": [b], "weight_decay": 0.0}],
        lr=hp["lr"], betas=hp["betas"], eps=hp["eps"], foreach=False,
    )
    for s in range(steps):
        a.grad, b.grad = grads[s][:n_decay].clone(), grads[s][n_decay:].clone()
        opt.step()
    return torch.cat([a.detach(), b.detach()])


def test_reference_equals_torch_adamw():
    n, nd = 301, 120
    p0, grads = _state(n)
    p, m, v = p0.clone(), torch.zeros(n), torch.zeros(n)
    for s in range(5):
        adamw_step_ref(p, grads[s], m, v, step=s + 1, n_decay=nd, **HP)
    torch.testing.assert_close(p, _torch_adamw(p0, grads, nd, HP, 5), atol=0, rtol=0)


@pytest.mark.parametrize("hp", [HP, dict(lr=1e-2, betas=(0.3, 0.95), eps=1e-6, weight_decay=0.1)])
def test_kernel_matches_reference_over_steps(hp, kernel_device):
    dev = kernel_device
    n, nd = 2053, 777  # not a multiple of the block; decay boundary inside a block
    p0, grads = _state(n, seed=1)
    pk, mk, vk = p0.to(dev, copy=True), torch.zeros(n, device=dev), torch.zeros(n, device=dev)
    pr, mr, vr = p0.clone(), torch.zeros(n), torch.zeros(n)
    step_t = torch.zeros((), dtype=torch.float32, device=dev)
    lr_t = torch.tensor(hp["lr"], dtype=torch.float32, device=dev)
    for s in range(6):
        step_t += 1
        adamw_step_(pk, grads[s].to(dev), mk, vk, step_t, lr_t, betas=hp["betas"], eps=hp["eps"],
                    weight_decay=hp["weight_decay"], n_decay=nd, block=512)
        adamw_step_ref(pr, grads[s], mr, vr, step=s + 1, n_decay=nd, **hp)
    pk, mk, vk = pk.cpu(), mk.cpu(), vk.cpu()
    # Within fp32 rounding: the kernel's lr is fp32(lr), and torch's vectorized CPU lerp may
    # fuse (FMA) where the kernel rounds, an ulp of the g - m intermediate (~4e-9 here).
    torch.testing.assert_close(mk, mr, atol=1e-8, rtol=1e-6)
    torch.testing.assert_close(vk, vr, atol=1e-11, rtol=1e-6)
    torch.testing.assert_close(pk, pr, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(pk, _torch_adamw(p0, grads, nd, hp, 6), atol=1e-7, rtol=1e-6)
    # The tolerance can fail: a wrong step count (bias correction) in the last step is visible.
    pw, mw, vw = p0.clone(), torch.zeros(n), torch.zeros(n)
    for s in range(6):
        adamw_step_ref(pw, grads[s], mw, vw, step=s + 1 if s < 5 else 7, n_decay=nd, **hp)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(pk, pw, atol=1e-7, rtol=1e-6)


def test_decay_boundary_is_used(kernel_device):
    """Fails if weight decay leaks past n_decay: a wrong kernel is detectable."""
    dev = kernel_device
    n, nd = 64, 20
    p, m, v = torch.ones(n, device=dev), torch.zeros(n, device=dev), torch.zeros(n, device=dev)
    hp = dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.5)
    adamw_step_(p, torch.zeros(n, device=dev), m, v, torch.tensor(1.0, device=dev), torch.tensor(0.1, device=dev),
                n_decay=nd, **hp)
    torch.testing.assert_close(p[:nd].cpu(), torch.full((nd,), 0.95))
    torch.testing.assert_close(p[nd:].cpu(), torch.ones(n - nd))


def test_flat_adamw_matches_torch_on_a_model(kernel_device):
    from ftlib import build_model
    from ftlib.training.step import make_optimizer, param_groups

    kw = dict(n_layer=1, n_embd=32, n_head=4, n_kv_head=1, block_size=16)
    ref = build_model("fasttransformer", seed=0, **kw)  # the reference trains on the CPU
    mod = build_model("fasttransformer", seed=0, **kw).to(kernel_device)
    opt_ref = make_optimizer(ref, lr=1e-3, weight_decay=0.1)
    opt = FlatAdamW(param_groups(mod, 0.1), lr=1e-3, weight_decay=0.1)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.randint(0, 65, (2, 16), generator=g)
        y = torch.randint(0, 65, (2, 16), generator=g)
        opt_ref.zero_grad(set_to_none=True)
        ref(x, y)[1].backward()
        opt_ref.step()
        opt.zero_grad()
        ptr = mod.head.weight.grad.data_ptr()
        mod(x.to(kernel_device), y.to(kernel_device))[1].backward()
        assert mod.head.weight.grad.data_ptr() == ptr  # autograd accumulated into the flat buffer
        opt.step()
    for (name, a), b in zip(ref.named_parameters(), mod.parameters()):
        assert b.device.type == kernel_device.type, name
        torch.testing.assert_close(b.detach().cpu(), a.detach(), atol=1e-6, rtol=1e-5, msg=name)
    assert opt.step_t.item() == 3


def test_launcher_rejects_bad_inputs(kernel_device):
    dev = kernel_device
    n = 16
    ok = [torch.zeros(n, device=dev) for _ in range(4)]
    s, lr = torch.tensor(1.0, device=dev), torch.tensor(1e-3, device=dev)
    with pytest.raises(TypeError, match="dtype"):
        adamw_step_(ok[0].double(), *ok[1:], s, lr)
    with pytest.raises(ValueError, match="contiguous"):
        adamw_step_(torch.zeros(2 * n, device=dev)[::2], *ok[1:], s, lr)
    with pytest.raises(ValueError, match="elements"):
        adamw_step_(ok[0], torch.zeros(n + 1, device=dev), *ok[2:], s, lr)
    with pytest.raises(TypeError, match="torch.Tensor"):
        adamw_step_(*ok, 1, lr)
    with pytest.raises(ValueError, match="n_decay"):
        adamw_step_(*ok, s, lr, n_decay=n + 1)
    with pytest.raises(ValueError, match="1 dims"):
        adamw_step_(torch.zeros(4, 4, device=dev), *ok[1:], s, lr)


@pytest.mark.parametrize("step", [0, -1, 0.0, 0.5])
def test_a_python_step_below_one_is_refused(step, kernel_device):
    # At step 0 the bias correction 1 - beta**0 is 0: the update would write NaN everywhere.
    ok = [torch.zeros(8, device=kernel_device) for _ in range(4)]
    with pytest.raises(ValueError, match=rf"step={step}: AdamW steps count from 1"):
        adamw_step_(*ok, step, torch.tensor(1e-3, device=kernel_device))
    assert all(not t.isnan().any() for t in ok)
