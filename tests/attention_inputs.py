"""Inputs and fp64 references shared by the fused attention kernel's tests (test_kernels_attention*.py)."""

import torch

from ftlib.model.reference import causal_attention_ref

BLK = dict(block_m=16, block_n=16)  # small blocks: T=37 spans 3 blocks with a ragged last one


def inputs(B, nh, nkv, T, hs, dtype, device, seed=0):
    # Drawn on the CPU (the same values on every device), then moved.
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_(True)
    q, k, v = mk(B, nh, T, hs), mk(B, nkv, T, hs), mk(B, nkv, T, hs)
    do = torch.randn(B, nh, T, hs, generator=g, dtype=torch.float64).to(device, dtype)
    return q, k, v, do


def reference(q, k, v, do):
    """fp64 reference output and gradients on the CPU from the same (rounded) inputs."""
    qr, kr, vr = (t.detach().cpu().double().requires_grad_(True) for t in (q, k, v))
    o = causal_attention_ref(qr, kr, vr)
    return (o, *torch.autograd.grad(o, (qr, kr, vr), do.cpu().double()))


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.detach().cpu().double() - ref).abs().max() / ref.abs().max()).item()
