"""Muon: the capturable update against torch.optim.Muon, and the Muon/AdamW split of a model."""

from __future__ import annotations

import pytest
import torch

from ftlib.model.config import preset
from ftlib.model.gpt import GPT, build_model
from ftlib.training.muon import (
    MuonAdamW,
    is_muon_param,
    lr_scale,
    make_muon_adamw,
    muon_update_,
    muon_update_grouped_,
    orthogonalize,
    orthogonalize_batched,
    split_params,
)


@pytest.mark.parametrize("shape", [(64, 32), (32, 64), (48, 48)])
def test_the_capturable_update_is_torch_muon(shape):
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(shape, generator=g)
    mine = ref.clone()
    ref = torch.nn.Parameter(ref)
    opt = torch.optim.Muon([ref], lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, adjust_lr_fn="original")
    buf = torch.zeros_like(mine)
    lr = torch.tensor([0.02])
    for _ in range(3):
        grad = torch.randn(shape, generator=g)
        ref.grad = grad.clone()
        opt.step()
        muon_update_([mine], [grad], [buf], lr, weight_decay=0.1, momentum=0.95)
    torch.testing.assert_close(mine, ref.detach(), rtol=0, atol=1e-6)
    # and a wrong momentum is caught
    other = ref.detach().clone()
    muon_update_([other], [grad], [torch.zeros_like(other)], lr, momentum=0.5)
    assert not torch.allclose(other, ref.detach(), atol=1e-4)


def test_orthogonalize_flattens_the_singular_values():
    # Singular values spread over a factor of 30 come out within [0.5, 1.5]: the quintic's
    # coefficients trade exact convergence to 1 for speed (Jordan et al. 2024).
    g = torch.randn(64, 32, generator=torch.Generator().manual_seed(1)) @ torch.diag(torch.logspace(-1, 0.5, 32))
    s = torch.linalg.svdvals(orthogonalize(g).float())
    assert s.min() > 0.5 and s.max() < 1.5
    assert torch.linalg.svdvals(g).max() / torch.linalg.svdvals(g).min() > 30
    assert lr_scale((64, 32)) == pytest.approx(2 ** 0.5) and lr_scale((32, 64)) == 1.0


def test_muon_takes_the_block_matrices_and_adamw_the_rest():
    model = GPT(preset("fasttransformer", n_layer=2))
    muon, rest = split_params(model)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(".blocks." in f".{names[id(p)]}" and p.ndim == 2 for p in muon)
    assert {names[id(p)].split(".")[0] for p in rest} >= {"wte", "wpe", "head"}  # embeddings and head: AdamW
    assert all(p.ndim == 1 for p in rest if names[id(p)].startswith("blocks"))  # the blocks' gains too
    assert len(muon) + len(rest) == len(list(model.parameters()))


def test_muon_adamw_steps_every_parameter_and_follows_the_schedule():
    torch.manual_seed(0)
    model = GPT(preset("fasttransformer", n_layer=1))
    opt = make_muon_adamw(model, muon_lr=0.02, adamw_lr=1e-3, weight_decay=0.1)
    assert isinstance(opt, MuonAdamW) and len(opt.param_groups) == 3
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randint(0, 65, (2, 16))
    _, loss = model(x, x)
    loss.backward()
    for grp in opt.param_groups:  # a schedule scales every group's base rate alike
        grp["lr"] = grp["initial_lr"] * 0.5
    opt.step()
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert opt.muon.param_groups[0]["lr"] == pytest.approx(0.01) and opt.adamw.param_groups[0]["lr"] == 5e-4
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    state = opt.state_dict()
    opt.load_state_dict(state)


def test_a_model_without_blocks_is_refused():
    with pytest.raises(ValueError, match="Muon has nothing"):
        split_params(torch.nn.Linear(4, 4))


def test_the_engine_runs_muon_as_the_plain_step_does(kernel_device):
    """The engine's Muon (flat buffer, device learning rate) and torch.optim.Muon in train_step
    train the same weights the same way, with AdamW for the rest in both."""
    from ftlib.training.engine import Engine
    from ftlib.training.step import train_step

    cfg = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=16)
    dev = kernel_device
    eng = Engine(cfg, 2, 16, "fp32", dev, seed=0, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, muon_lr=0.02,
                 use_kernels=False)
    ref = build_model(cfg, seed=0).to(dev)
    opt = make_muon_adamw(ref, muon_lr=0.02, adamw_lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    g = torch.Generator().manual_seed(3)
    for step in range(3):
        x = torch.randint(0, 65, (2, 16), generator=g).to(dev)
        y = torch.randint(0, 65, (2, 16), generator=g).to(dev)
        lr = 1e-3 * (1 - step / 4)
        eng.set_lr(lr, muon_lr=0.02 * (1 - step / 4))
        for grp in opt.param_groups:
            grp["lr"] = grp["initial_lr"] * (1 - step / 4)
        a = eng.step(x, y).item()
        b = train_step(ref, opt, x, y).item()
        assert abs(a - b) <= 1e-5 * abs(b), (step, a, b)
    # Newton-Schulz runs in bf16 (as torch's does), and its quintic expands small singular values
    # (slope 3.4 at zero, five times): gradients that differ in their last fp32 bits (the engine sums
    # into flat buffers in another order) round to different bf16 values, and a few elements of an
    # update move by a fair fraction of it. So Muon's matrices are compared by the size of the
    # difference against the size of what training changed: a few percent, where a wrong update
    # (no Nesterov, another shape factor) is tens of percent off. AdamW's parameters see no bf16:
    # their updates (about lr = 1e-3 per element) agree to 1% of one.
    mine = dict(eng.model.named_parameters())
    init = dict(build_model(cfg, seed=0).to(dev).named_parameters())
    for name, p in ref.named_parameters():
        if is_muon_param(name, p):
            moved = (p - init[name]).norm()
            assert (mine[name] - p).norm() <= 0.05 * moved, (name, float((mine[name] - p).norm() / moved))
        else:
            torch.testing.assert_close(mine[name], p, rtol=0, atol=1e-5)
    assert eng.describe()["optimizer"].startswith("muon + ")
    with pytest.raises(ValueError, match="runs AdamW only"):
        Engine(cfg, 2, 16, "fp32", dev, use_kernels=False).set_lr(1e-3, muon_lr=0.02)


def test_the_grouped_update_is_the_per_matrix_update():
    # A model's mix: several matrices of one shape, tall and wide ones, and one alone.
    g = torch.Generator().manual_seed(2)
    shapes = [(40, 24), (24, 40), (40, 24), (32, 32), (24, 40), (40, 24)]
    ref = [torch.randn(s, generator=g) for s in shapes]
    mine = [p.clone() for p in ref]
    ref_bufs, bufs = [torch.zeros_like(p) for p in ref], [torch.zeros_like(p) for p in ref]
    lr = torch.tensor(0.02)
    for _ in range(3):
        grads = [torch.randn(s, generator=g) for s in shapes]
        muon_update_(ref, grads, ref_bufs, lr, weight_decay=0.1, momentum=0.95)
        muon_update_grouped_(mine, grads, bufs, lr, weight_decay=0.1, momentum=0.95)
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    for a, b in zip(bufs, ref_bufs):
        torch.testing.assert_close(a, b)
    # A stack that mixed up its matrices would not match: swap two of one shape.
    swapped = [p.clone() for p in ref]
    muon_update_grouped_(swapped, [grads[2], grads[1], grads[0], *grads[3:]], [b.clone() for b in bufs], lr)
    ref_step = [p.clone() for p in ref]
    muon_update_(ref_step, grads, [b.clone() for b in bufs], lr)
    assert not torch.allclose(swapped[0], ref_step[0], atol=1e-4)


def test_orthogonalize_batched_is_orthogonalize_per_matrix():
    g = torch.randn(3, 48, 20, generator=torch.Generator().manual_seed(3))
    out = orthogonalize_batched(g)
    assert out.shape == g.shape
    for i in range(3):
        torch.testing.assert_close(out[i].float(), orthogonalize(g[i]).float(), rtol=0, atol=1e-2)


def test_the_grouped_update_refuses_what_it_cannot_run():
    p = [torch.zeros(4, 4)]
    with pytest.raises(ValueError, match="0-dim"):
        muon_update_grouped_(p, p, [torch.zeros(4, 4)], torch.tensor([0.1]))
    with pytest.raises(ValueError, match="2-D"):
        muon_update_grouped_([torch.zeros(4)], [torch.zeros(4)], [torch.zeros(4)], torch.tensor(0.1))
