"""The fused attention kernels' launch orders give the default order's results bit for bit: every grid heaviest
block first (heavy_first) and the dK/dV kernel's paired key blocks (pair_key_blocks). On kernel_device
(tests/conftest.py: the CPU interpreter, or compiled on CUDA with FTLIB_TEST_GPU=1)."""

import pytest
import torch

pytest.importorskip("triton")

from attention_inputs import BLK, inputs, reference, rel_err  # noqa: E402

from kernels.attention import flash_attention  # noqa: E402

pytestmark = pytest.mark.kernels


# heavy_first: each grid's axes swapped so every row's block with the most causal work launches first
# (kernels/attention.py's _grid). The same programs compute the same sums: the default order's results bit for
# bit; a grid the kernels do not read as launched would leave blocks unwritten, which that comparison sees (the
# outputs allocated NaN-filled: tests/conftest.py's nan_empty).

def _run_both_passes(q, k, v, do, **kw) -> tuple[torch.Tensor, ...]:
    from kernels.attention import attention_bwd, attention_fwd

    fwd = {n: kw[n] for n in ("pack_heads", "heavy_first") if n in kw}
    o, lse = attention_fwd(q, k, v, **BLK, **fwd)
    return (o, lse, *attention_bwd(do, q, k, v, o, lse, **BLK, **kw))


@pytest.mark.parametrize("nh,nkv,options", [
    (4, 4, {}),
    (4, 1, {"kv_split": 2, "fuse_kv_split_sum": True}),
    (4, 1, {"kv_split": 1, "concurrent": True}),
    (8, 2, {"pack_heads": 4, "kv_split": 2}),
], ids=["mha", "mqa-split", "mqa-concurrent", "gqa-packed"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)], ids=["fp32", "bf16"])
def test_heavy_first_gives_the_default_orders_results_bit_for_bit(nh, nkv, options, dtype, tol, kernel_device,
                                                                  nan_empty):
    q, k, v, do = (t.detach() for t in inputs(2, nh, nkv, 37, 32, dtype, kernel_device, seed=4))
    default = _run_both_passes(q, k, v, do, **options)
    heavy = _run_both_passes(q, k, v, do, heavy_first=True, **options)
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), heavy, default):
        assert torch.equal(a, b), name
    for name, got, want in zip(("o", "dq", "dk", "dv"), (heavy[0], *heavy[2:]), reference(q, k, v, do)):
        assert rel_err(got, want) < tol, (name, rel_err(got, want))


def test_a_grid_the_kernels_do_not_read_as_launched_would_show(kernel_device, monkeypatch, nan_empty):
    """The kernels told heavy_first on the default grid: blocks are read on the wrong axis, so some rows are
    computed for the wrong positions or heads and others never written; the comparison above fails."""
    import kernels.attention as flash

    q, k, v, do = (t.detach() for t in inputs(2, 4, 1, 37, 32, torch.float32, kernel_device, seed=4))
    default = _run_both_passes(q, k, v, do)
    monkeypatch.setattr(flash, "_grid", lambda blocks, rows, heavy_first: (blocks, rows))
    wrong = _run_both_passes(q, k, v, do, heavy_first=True)
    assert not all(torch.equal(a, b) for a, b in zip(wrong, default))


def test_the_grid_swaps_only_when_asked_and_the_flag_is_a_bool(kernel_device):
    from kernels.attention import _grid, attention_bwd, attention_fwd

    assert _grid(3, 64, False) == (3, 64) and _grid(3, 64, True) == (64, 3)
    q, k, v, do = (t.detach() for t in inputs(2, 4, 1, 37, 32, torch.float32, kernel_device, seed=4))
    o, lse = attention_fwd(q, k, v, **BLK)
    with pytest.raises(TypeError, match="heavy_first must be a bool"):
        attention_fwd(q, k, v, heavy_first=1)
    with pytest.raises(TypeError, match="heavy_first must be a bool"):
        attention_bwd(do, q, k, v, o, lse, heavy_first="yes")
    with pytest.raises(TypeError, match="pair_key_blocks must be a bool"):
        attention_bwd(do, q, k, v, o, lse, pair_key_blocks=1)


# pair_key_blocks: the dK/dV kernel's program j takes key blocks j and n - 1 - j (the kernel's PAIRED). Each key
# block's sums are the same operations in the same order, so with the same split of the query heads the results
# equal the unpaired kernel's bit for bit; a block left to a partner that never computes it would not.

@pytest.mark.parametrize("T", [16, 37, 64], ids=["one-block", "odd-blocks", "even-blocks"])
@pytest.mark.parametrize("nh,nkv,options", [
    (4, 4, {}),
    (4, 1, {"kv_split": 2, "fuse_kv_split_sum": True}),
    (4, 1, {"kv_split": 1, "concurrent": True, "heavy_first": True}),
], ids=["mha", "mqa-split", "mqa-concurrent-heavy"])
def test_paired_key_blocks_give_the_unpaired_results_bit_for_bit(T, nh, nkv, options, kernel_device, nan_empty):
    q, k, v, do = (t.detach() for t in inputs(2, nh, nkv, T, 32, torch.float32, kernel_device, seed=5))
    default = _run_both_passes(q, k, v, do, **options)
    paired = _run_both_passes(q, k, v, do, pair_key_blocks=True, **options)
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), paired, default):
        assert torch.equal(a, b), name
    for name, got, want in zip(("dk", "dv"), paired[3:], reference(q, k, v, do)[2:]):
        assert rel_err(got, want) < 1e-5, (name, rel_err(got, want))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)], ids=["fp32", "bf16"])
def test_paired_key_blocks_with_the_launchers_split_match_the_reference(dtype, tol, kernel_device):
    """Without a fixed split the launcher chooses one for the halved grid (on a GPU it may differ from the
    unpaired one, and so the partial sums' order): the reference decides."""
    q, k, v, do = inputs(2, 8, 1, 37, 32, dtype, kernel_device, seed=6)
    o = flash_attention(q, k, v, **BLK, pair_key_blocks=True)
    grads = torch.autograd.grad(o, (q, k, v), do)
    for name, got, want in zip(("dq", "dk", "dv"), grads, reference(q, k, v, do)[1:]):
        assert rel_err(got, want) < tol, (name, rel_err(got, want))


def test_a_partner_block_never_computed_would_show(kernel_device, monkeypatch, nan_empty):
    """The paired grid (half the key-block slots) launched on a kernel told not to pair: the second half of the
    key blocks is never written (NaN from ``nan_empty``), and dK, dV differ there from the unpaired kernel's."""
    import kernels.attention as flash

    real = flash._attn_bwd_dkdv_kernel

    class Unpaired:
        def __getitem__(self, grid):
            return lambda *a, **kw: real[grid](*a, **{**kw, "PAIRED": False})

    q, k, v, do = (t.detach() for t in inputs(2, 4, 1, 64, 32, torch.float32, kernel_device, seed=5))
    default = _run_both_passes(q, k, v, do, kv_split=2)
    monkeypatch.setattr(flash, "_attn_bwd_dkdv_kernel", Unpaired())
    wrong = _run_both_passes(q, k, v, do, kv_split=2, pair_key_blocks=True)
    for name, a, b in zip(("dk", "dv"), wrong[3:], default[3:]):
        assert torch.equal(a[:, :, :32], b[:, :, :32]), name  # key blocks 0 and 1: computed in either grid
        assert not torch.equal(a[:, :, 32:], b[:, :, 32:]), name  # blocks 2 and 3: left to partners
