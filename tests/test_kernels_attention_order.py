"""The attention kernels' ``heavy_first`` launch order (kernels/attention.py's ``_grid``): the grid's axes swap so
that each row's block with the most causal work starts first. The same programs compute the same sums, so every
output is bit for bit the default order's, and both match the fp64 reference; a grid that did not match the
kernels' reading of it would leave blocks unwritten, which the comparison sees."""

import pytest
import torch

pytest.importorskip("triton")

import kernels.attention as flash  # noqa: E402
from ftlib.model.reference import causal_attention_ref  # noqa: E402

pytestmark = pytest.mark.kernels

BLK = dict(block_m=16, block_n=16)  # T=37: three blocks, the last ragged, so the blocks' work differs


def _inputs(nh: int, nkv: int, dtype: torch.dtype, device: torch.device, seed: int = 4):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(device, dtype)  # noqa: E731
    return mk(2, nh, 37, 32), mk(2, nkv, 37, 32), mk(2, nkv, 37, 32), mk(2, nh, 37, 32)


def _run(q, k, v, do, **kw) -> tuple[torch.Tensor, ...]:
    fwd = {n: kw[n] for n in ("pack_heads", "heavy_first") if n in kw}
    o, lse = flash.attention_fwd(q, k, v, **BLK, **fwd)
    return (o, lse, *flash.attention_bwd(do, q, k, v, o, lse, **BLK, **kw))


def _reference(q, k, v, do) -> tuple[torch.Tensor, ...]:
    qr, kr, vr = (t.cpu().double().requires_grad_(True) for t in (q, k, v))
    o = causal_attention_ref(qr, kr, vr)
    return (o.detach(), *torch.autograd.grad(o, (qr, kr, vr), do.cpu().double()))


@pytest.mark.parametrize("nh,nkv,options", [
    (4, 4, {}),
    (4, 1, {"kv_split": 2, "fuse_kv_split_sum": True}),
    (4, 1, {"kv_split": 1, "concurrent": True}),
    (8, 2, {"pack_heads": 4, "kv_split": 2}),
], ids=["mha", "mqa-split", "mqa-concurrent", "gqa-packed"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)], ids=["fp32", "bf16"])
def test_heavy_first_gives_the_default_orders_results_bit_for_bit(nh, nkv, options, dtype, tol, kernel_device):
    q, k, v, do = _inputs(nh, nkv, dtype, kernel_device)
    default = _run(q, k, v, do, **options)
    heavy = _run(q, k, v, do, heavy_first=True, **options)
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), heavy, default):
        assert torch.equal(a, b), name
    ref = _reference(q, k, v, do)
    for name, got, want in zip(("o", "dq", "dk", "dv"), (heavy[0], *heavy[2:]), ref):
        err = ((got.cpu().double() - want).abs().max() / want.abs().max()).item()
        assert err < tol, (name, err)


def test_a_grid_the_kernels_do_not_read_as_launched_would_show(kernel_device, monkeypatch):
    """The kernels told heavy_first on the default grid: blocks are read on the wrong axis, so some rows are
    computed for the wrong positions or heads and others never written; the comparison above fails."""
    q, k, v, do = _inputs(4, 1, torch.float32, kernel_device)
    default = _run(q, k, v, do)
    monkeypatch.setattr(flash, "_grid", lambda blocks, rows, heavy_first: (blocks, rows))
    wrong = _run(q, k, v, do, heavy_first=True)
    assert not all(torch.equal(a, b) for a, b in zip(wrong, default))


def test_the_grid_swaps_only_when_asked_and_the_flag_is_a_bool(kernel_device):
    assert flash._grid(3, 64, False) == (3, 64) and flash._grid(3, 64, True) == (64, 3)
    q, k, v, do = _inputs(4, 1, torch.float32, kernel_device)
    o, lse = flash.attention_fwd(q, k, v, **BLK)
    with pytest.raises(TypeError, match="heavy_first must be a bool"):
        flash.attention_fwd(q, k, v, heavy_first=1)
    with pytest.raises(TypeError, match="heavy_first must be a bool"):
        flash.attention_bwd(do, q, k, v, o, lse, heavy_first="yes")
