"""The fused MQA dK/dV split sum (kernels/kv_split_sum.py) against the PyTorch it replaces, on kernel_device
(tests/conftest.py: the CPU interpreter, or compiled on CUDA with FTLIB_TEST_GPU=1); then attention_bwd and
the engine with ``fuse_kv_split_sum`` on against off."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import kernels.attention as attention  # noqa: E402
from ftlib.harness.engine_check import pattern_batches  # noqa: E402
from ftlib.model.config import preset  # noqa: E402
from ftlib.model.reference import kv_split_sum_ref  # noqa: E402
from ftlib.training.engine import Engine, EngineOptions  # noqa: E402
from ftlib.training.engine.options import key_items, option_docs  # noqa: E402
from kernels.kv_split_sum import kv_split_sum  # noqa: E402

pytestmark = [pytest.mark.kernels, pytest.mark.usefixtures("results_root")]

LOWP = (torch.bfloat16, torch.float16)


def _partials(B, nkv, n_split, T, hs, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    # An offset, so a dropped or doubled split is off by a visible amount, not by noise.
    mk = lambda: (torch.randn(B, nkv * n_split, T, hs, generator=g) + 0.25).to(device)  # noqa: E731
    return mk(), mk()


def _reference(part, nkv, n_split, out):
    """What attention_bwd does without the option: view, sum, cast, copy into the destination."""
    assert part.shape[1] == nkv * n_split
    return kv_split_sum_ref(part, nkv, out)


def _packed(B, T, nh, nkv, hs, dtype, device, fill=7.0):
    """dk, dv views (B, nkv, T, hs) of a (B, T, (nh + 2 nkv) hs) buffer laid out as the engine's d(qkv)."""
    C, kvd = nh * hs, nkv * hs
    buf = torch.full((B, T, C + 2 * kvd), fill, dtype=dtype, device=device)
    dk = buf[..., C:C + kvd].view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs), a view
    dv = buf[..., C + kvd:].view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs), a view
    return buf, dk, dv


def _outputs(layout, B, nkv, T, hs, dtype, device):
    if layout == "contiguous":
        return None, torch.empty(B, nkv, T, hs, dtype=dtype, device=device), torch.empty(
            B, nkv, T, hs, dtype=dtype, device=device)
    if layout == "packed":
        return _packed(B, T, 4 * nkv, nkv, hs, dtype, device)
    # head dim not unit-stride: (B, nkv, hs, T) storage seen as (B, nkv, T, hs)
    mk = lambda: torch.empty(B, nkv, hs, T, dtype=dtype, device=device).transpose(2, 3)  # noqa: E731
    return None, mk(), mk()


def _ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 values as integers in the order of the floats: adjacent values differ by 1, across 0 too."""
    i = t.contiguous().view(torch.int16).to(torch.int32)
    return torch.where(i < 0, -(i & 0x7FFF), i)


def _assert_close(got, want, part, n_split, name):
    got, want = got.cpu(), want.cpu()
    if got.dtype in LOWP:
        # Both round one fp32 sum to the output dtype; the two fp32 sums may differ in their last bit (another
        # order) and the interpreter's cast may truncate where torch rounds to nearest: 1 ulp at most.
        ulps = (_ordered_bits(got) - _ordered_bits(want)).abs().max().item()
        assert ulps <= 1, f"{name} ({got.dtype}): {ulps} ulps apart"
    else:
        # Any order of n fp32 additions is within (n - 1) * eps/2 * sum |x_s| of the exact sum, so two orders
        # are within (n - 1) * eps * sum |x_s| of each other, element by element.
        B, _, T, hs = part.shape
        mag = part.cpu().abs().view(B, -1, n_split, T, hs).sum(2)
        bound = (n_split - 1) * torch.finfo(torch.float32).eps * mag
        excess = ((got.double() - want.double()).abs() - bound.double()).max().item()
        assert excess <= 0, f"{name}: {excess:.3g} over the reordering bound"


@pytest.mark.parametrize("layout", ["contiguous", "packed", "head-dim-strided"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("nkv,n_split", [(1, 2), (1, 4), (2, 2), (2, 4)])
def test_matches_the_torch_sum_cast_and_copy(nkv, n_split, dtype, layout, kernel_device):
    B, T, hs = 2, 13, 16  # T = 13: one full 8-row interpreter tile and a ragged one
    dkp, dvp = _partials(B, nkv, n_split, T, hs, kernel_device, seed=nkv * 10 + n_split)
    buf, dk, dv = _outputs(layout, B, nkv, T, hs, dtype, kernel_device)
    before = None if buf is None else buf.clone()
    got_k, got_v = kv_split_sum(dkp, dvp, dk, dv)
    assert got_k is dk and got_v is dv  # written in place, through the views' strides
    _, rk, rv = _outputs(layout, B, nkv, T, hs, dtype, kernel_device)
    _assert_close(dk, _reference(dkp, nkv, n_split, rk), dkp, n_split, "dk")
    _assert_close(dv, _reference(dvp, nkv, n_split, rv), dvp, n_split, "dv")
    if buf is not None:  # the q columns of the packed buffer are untouched
        C = 4 * nkv * hs
        assert torch.equal(buf[..., :C], before[..., :C])


def test_head_size_not_a_power_of_two_and_fp64(kernel_device):
    B, nkv, n_split, T, hs = 1, 2, 3, 9, 24  # hs = 24: a masked 32-wide column block
    dkp, dvp = (p.double() for p in _partials(B, nkv, n_split, T, hs, kernel_device, seed=5))
    dk, dv = (torch.empty(B, nkv, T, hs, dtype=torch.float64, device=kernel_device) for _ in range(2))
    kv_split_sum(dkp, dvp, dk, dv)
    # fp64: accumulated in fp64, the order's error ~1e-16 relative
    want_k = dkp.view(B, nkv, n_split, T, hs).sum(2)
    torch.testing.assert_close(dk, want_k, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(dv, dvp.view(B, nkv, n_split, T, hs).sum(2), rtol=1e-14, atol=1e-14)


def test_wrong_arguments_raise(kernel_device):
    dkp, dvp = _partials(2, 1, 2, 8, 16, kernel_device)
    out = lambda *s, dt=torch.float32: torch.empty(*s, dtype=dt, device=kernel_device)  # noqa: E731
    dk, dv = out(2, 1, 8, 16), out(2, 1, 8, 16)
    with pytest.raises(TypeError, match="dk_part has dtype torch.bfloat16"):
        kv_split_sum(dkp.bfloat16(), dvp, dk, dv)
    with pytest.raises(ValueError, match="dv_part must be contiguous"):
        kv_split_sum(dkp, dvp.transpose(2, 3).contiguous().transpose(2, 3), dk, dv)
    with pytest.raises(ValueError, match="dk_part and dv_part must match"):
        kv_split_sum(dkp, dvp.double(), dk, dv)
    with pytest.raises(ValueError, match=r"outputs must be \(B, nkv, T, hs\)"):
        kv_split_sum(dkp, dvp, out(2, 1, 7, 16), out(2, 1, 7, 16))
    with pytest.raises(ValueError, match="nkv dividing"):
        kv_split_sum(dkp, dvp, out(2, 3, 8, 16), out(2, 3, 8, 16))
    with pytest.raises(ValueError, match="the same shape"):
        kv_split_sum(dkp, dvp, dk, out(2, 2, 8, 16))
    with pytest.raises(ValueError, match="must have 4 dims"):
        kv_split_sum(dkp, dvp, dk[0], dv)
    with pytest.raises(ValueError, match="device"):  # a device no Triton kernel runs on
        kv_split_sum(dkp, dvp, dk, torch.empty(2, 1, 8, 16, device="meta"))
    with pytest.raises(ValueError, match="tile_elems must be positive"):
        kv_split_sum(dkp, dvp, dk, dv, tile_elems=0)


def _mqa(nh, nkv, T, hs, dtype, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(device, dtype)  # noqa: E731
    q, k, v, do = mk(2, nh, T, hs), mk(2, nkv, T, hs), mk(2, nkv, T, hs), mk(2, nh, T, hs)
    o, lse = attention.attention_fwd(q, k, v, block_m=16, block_n=16)
    return do, q, k, v, o, lse


@pytest.mark.parametrize("packed", [False, True], ids=["fresh", "packed-views"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("nh,forced", [(4, None), (8, 4)], ids=["nh4-own-split", "nh8-split4"])
def test_attention_bwd_with_the_option_equals_without(nh, forced, dtype, packed, kernel_device, monkeypatch):
    if forced is not None:  # on the CPU the split is 2 where the group allows; take more splits
        monkeypatch.setattr(attention, "_kv_split", lambda *a: forced)
    calls = []

    def spy(*a):
        calls.append(a[0].shape)
        return kv_split_sum(*a)

    monkeypatch.setattr(attention, "kv_split_sum", spy)
    nkv, T, hs = 1, 37, 16
    args = _mqa(nh, nkv, T, hs, dtype, kernel_device)

    def run(fuse):
        if not packed:
            return attention.attention_bwd(*args, block_m=16, block_n=16, fuse_kv_split_sum=fuse), None
        buf, dk, dv = _packed(2, T, nh, nkv, hs, dtype, kernel_device, fill=0.0)
        dq = buf[..., :nh * hs].view(2, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs), a view
        out = attention.attention_bwd(*args, block_m=16, block_n=16, dq_out=dq, dk_out=dk, dv_out=dv,
                                      fuse_kv_split_sum=fuse)
        assert all(a is b for a, b in zip(out, (dq, dk, dv)))
        return out, buf

    (dq0, dk0, dv0), buf0 = run(False)
    assert calls == []
    (dq1, dk1, dv1), buf1 = run(True)
    # the split attention_bwd picks itself: 2 in the interpreter, by SM count on a GPU
    n_split = forced or attention._kv_split(2, nkv, nh // nkv, -(-T // 16), torch.device(kernel_device))
    assert n_split > 1, "the case must exercise the split path"
    assert calls == [(2, nkv * n_split, T, hs)], "the fused sum ran once, on the split partials"
    assert dk1.dtype == dv1.dtype == dtype and dk1.shape == (2, nkv, T, hs)
    assert torch.equal(dq1, dq0)  # the dQ kernel is not touched by the option
    for name, a, b in (("dk", dk1, dk0), ("dv", dv1, dv0)):
        if dtype in LOWP:
            ulps = (_ordered_bits(a.cpu()) - _ordered_bits(b.cpu())).abs().max().item()
            assert ulps <= 1, f"{name}: {ulps} ulps"
        else:  # the same partials summed in another order: fp32 reordering, relative to the gradient's scale
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * b.abs().max().item(), msg=name)
    if packed:
        torch.testing.assert_close(buf1, buf0, rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-5)


def test_attention_bwd_without_a_split_ignores_the_option(kernel_device, monkeypatch):
    calls = []
    monkeypatch.setattr(attention, "kv_split_sum", lambda *a: calls.append(1))
    args = _mqa(4, 4, 16, 16, torch.float32, kernel_device)  # MHA: group 1, n_split 1
    on = attention.attention_bwd(*args, block_m=16, block_n=16, fuse_kv_split_sum=True)
    off = attention.attention_bwd(*args, block_m=16, block_n=16)
    assert calls == [] and all(torch.equal(a, b) for a, b in zip(on, off))


B, T = 1, 16
FT1 = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T)


@pytest.mark.parametrize("prec", ["tf32", "bf16"])  # the attention kernel runs in both (strict fp32 keeps SDPA)
def test_engine_trains_like_the_default(prec, kernel_device, monkeypatch):
    calls = []
    monkeypatch.setattr(attention, "kv_split_sum", lambda *a: calls.append(1) or kv_split_sum(*a))
    engines = [Engine(FT1, B, T, prec, kernel_device, seed=4, lr=1e-2, **o)
               for o in ({"fuse_kv_split_sum": False}, {})]  # without the option, and the default (with it)
    assert [e.describe()["fuse_kv_split_sum"] for e in engines] == [False, True]
    losses = [[], []]
    for x, y in pattern_batches(FT1.vocab_size, B, T, 3, seed=7, device=kernel_device):
        for eng, out in zip(engines, losses):
            out.append(float(eng.step(x, y)))
    assert calls, "the fused sum ran in the engine's backward"
    # fp32 partials summed in another order (tf32), or one bf16 rounding apart (bf16): rounding only, where a
    # wrong dK or dV (lr 1e-2) moves the losses of the next steps by far more.
    assert losses[1] == pytest.approx(losses[0], rel=1e-5 if prec == "tf32" else 2e-3)
    torch.testing.assert_close(engines[1].flat_param, engines[0].flat_param,
                               rtol=0, atol=1e-5 if prec == "tf32" else 2 * 3 * 1e-2)


def test_option_is_validated_documented_and_keyed_only_when_set(kernel_device):
    assert EngineOptions().fuse_kv_split_sum is True  # a default since it won its trial (engine_candidates)
    assert "kv_split_sum" in option_docs()["fuse_kv_split_sum"]
    with pytest.raises(ValueError, match=r"fuse_kv_split_sum=1 must be True or False"):
        EngineOptions(fuse_kv_split_sum=1)
    assert key_items([("fuse_kv_split_sum", True)]) == (("fuse_kv_split_sum", True),)
    # Not applied where there is no split: MHA, or the attention kernel off.
    mha = FT1.replace(n_kv_head=4)
    assert not Engine(mha, B, T, "tf32", kernel_device, fuse_kv_split_sum=True).describe()["fuse_kv_split_sum"]
    off = Engine(FT1, B, T, "tf32", kernel_device, fuse_kv_split_sum=True, use_kernels={"attention": False})
    assert not off.describe()["fuse_kv_split_sum"]
