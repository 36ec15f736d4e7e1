"""The token and position embeddings summed by one kernel (kernels/embedding_sum.py) against
``ftlib.model.reference.embedding_sum_ref`` on kernel_device (tests/conftest.py: the CPU interpreter, or
compiled on CUDA with FTLIB_TEST_GPU=1): the values, both gradients against fp64 sums, the gradients added
into given buffers, fp64 gradcheck, and the checks of every argument."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from ftlib.model.reference import embedding_sum_ref  # noqa: E402
from kernels._common import ATOMIC_SEMS, interpret_mode  # noqa: E402
from kernels.embedding_sum import (  # noqa: E402
    backward_runs,
    embedding_sum,
    embedding_sum_bwd,
    embedding_sum_fwd,
)

pytestmark = pytest.mark.kernels


def _inputs(B, T, V, C, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, V, (B, T), generator=g)
    idx.view(-1)[: 3] = idx.view(-1)[-1]  # a symbol repeated: its rows must add up
    wte = torch.randn(V, C, generator=g).to(dtype)
    wpe = torch.randn(T + 3, C, generator=g).to(dtype)  # more rows than positions, as a model's block_size
    dx = (torch.randn(B, T, C, generator=g) + 0.25).to(dtype)  # an offset: a dropped or doubled row shows
    return idx.to(device), wte.to(device), wpe.to(device), dx.to(device)


def _exact_grads(idx, wpe_rows, dx):
    """Both tables' gradients summed in fp64 on the CPU."""
    B, T, C = dx.shape
    d = dx.detach().double().cpu()
    dwte = torch.zeros(int(idx.max()) + 1, C, dtype=torch.float64).index_add_(0, idx.cpu().reshape(-1),
                                                                              d.reshape(-1, C))
    dwpe = torch.zeros(wpe_rows, C, dtype=torch.float64)
    dwpe[:T] = d.sum(0)
    return dwte, dwpe


# (B, T, V, C): the headline's shape scaled down, a width that is not a power of two (partial column tiles),
# one row, and more columns than one interpreter tile.
SHAPES = [(3, 9, 7, 13), (1, 1, 2, 5), (4, 6, 11, 40)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_forward_matches_the_reference_exactly(shape, dtype, kernel_device):
    B, T, V, C = shape
    idx, wte, wpe, _ = _inputs(B, T, V, C, dtype, kernel_device)
    x = embedding_sum_fwd(idx, wte, wpe)
    assert x.shape == (B, T, C) and x.dtype == dtype
    # One add of two table rows, formed in fp32 and rounded once: what PyTorch's add gives, bit for bit. Triton's
    # interpreter truncates fp32 to bf16 where a GPU (and PyTorch) rounds to nearest: there, within one bf16 ulp.
    ulp = dtype == torch.bfloat16 and interpret_mode()
    torch.testing.assert_close(x, embedding_sum_ref(idx, wte, wpe), rtol=2 ** -7 if ulp else 0, atol=0)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("b_run", [None, 1, 2, 100])
@pytest.mark.parametrize("sem", ATOMIC_SEMS)
def test_gradients_match_fp64_sums(shape, b_run, sem, kernel_device):
    B, T, V, C = shape
    idx, wte, wpe, dx = _inputs(B, T, V, C, torch.float32, kernel_device)
    dwte, dwpe = torch.zeros_like(wte), torch.zeros_like(wpe)
    embedding_sum_bwd(idx, dx, dwte, dwpe, b_run=b_run, sem=sem)
    exact_te, exact_pe = _exact_grads(idx, wpe.shape[0], dx)
    torch.testing.assert_close(dwte.double().cpu()[: exact_te.shape[0]], exact_te, rtol=1e-5, atol=1e-5)
    assert not dwte[exact_te.shape[0]:].any()  # symbols no row uses get nothing
    torch.testing.assert_close(dwpe.double().cpu(), exact_pe, rtol=1e-5, atol=1e-5)  # rows past T stay 0


def test_backward_adds_into_what_the_buffers_hold(kernel_device):
    idx, wte, wpe, dx = _inputs(2, 5, 4, 6, torch.float32, kernel_device)
    dwte, dwpe = torch.full_like(wte, 3.0), torch.full_like(wpe, -1.0)
    embedding_sum_bwd(idx, dx, dwte, dwpe)
    exact_te, exact_pe = _exact_grads(idx, wpe.shape[0], dx)
    torch.testing.assert_close(dwte.double().cpu()[: exact_te.shape[0]], exact_te + 3.0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dwpe.double().cpu(), exact_pe - 1.0, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sem", ATOMIC_SEMS)
def test_autograd_returns_the_gradients_or_adds_them_into_buffers(dtype, sem, kernel_device):
    B, T, V, C = 3, 7, 5, 9
    idx, wte, wpe, dx = _inputs(B, T, V, C, dtype, kernel_device)
    ref_te, ref_pe = (t.clone().requires_grad_() for t in (wte, wpe))
    embedding_sum_ref(idx, ref_te, ref_pe).backward(dx)

    te, pe = (t.clone().requires_grad_() for t in (wte, wpe))
    embedding_sum(idx, te, pe, sem=sem).backward(dx)  # returned to autograd, in the tables' dtype
    assert te.grad.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2 ** -7, atol=2 ** -7)
    torch.testing.assert_close(te.grad.float(), ref_te.grad.float(), **tol)
    torch.testing.assert_close(pe.grad.float(), ref_pe.grad.float(), **tol)

    te, pe = (t.clone().requires_grad_() for t in (wte, wpe))
    dte, dpe = torch.zeros(wte.shape, device=kernel_device), torch.zeros(wpe.shape, device=kernel_device)
    embedding_sum(idx, te, pe, dte, dpe, sem=sem).backward(dx)
    assert te.grad is None and pe.grad is None  # autograd received nothing: the buffers hold them
    torch.testing.assert_close(dte, ref_te.grad.float(), **tol)
    torch.testing.assert_close(dpe, ref_pe.grad.float(), **tol)


def test_gradcheck_fp64(kernel_device):
    idx = torch.tensor([[0, 2, 2], [1, 0, 2]], device=kernel_device)
    wte = torch.randn(3, 4, dtype=torch.float64, device=kernel_device, requires_grad=True)
    wpe = torch.randn(5, 4, dtype=torch.float64, device=kernel_device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: embedding_sum(idx, a, b), (wte, wpe))


def test_backward_runs_fill_the_device():
    cpu = torch.device("cpu")  # the interpreter's 4 SMs: about 8 programs
    assert backward_runs(cpu, 32, 1) == 4  # one tile: the batch in 8 runs of 4 rows
    assert backward_runs(cpu, 32, 2) == 8  # two tiles: 4 runs each
    assert backward_runs(cpu, 32, 16) == 32  # the tiles alone fill the grid: the batch in one run
    assert backward_runs(cpu, 3, 1) == 1  # fewer rows than programs: one row each


def test_the_checks_name_what_is_wrong(kernel_device):
    idx, wte, wpe, dx = _inputs(2, 4, 5, 6, torch.float32, kernel_device)
    with pytest.raises(ValueError, match="token ids must lie in"):
        embedding_sum(torch.full_like(idx, 5), wte, wpe, check_ids=True)
    with pytest.raises(ValueError, match="4 positions; wpe has 3"):
        embedding_sum(idx, wte, wpe[:3])
    with pytest.raises(ValueError, match="share their dtype and width"):
        embedding_sum(idx, wte, wpe.double())
    with pytest.raises(ValueError, match="both dwte_out and dwpe_out"):
        embedding_sum(idx, wte, wpe, torch.zeros_like(wte))
    with pytest.raises(ValueError, match="dwpe_out must be contiguous"):
        embedding_sum(idx, wte, wpe, torch.zeros_like(wte), torch.zeros(3, 6, device=kernel_device))
    with pytest.raises(TypeError, match="idx has dtype"):
        embedding_sum(idx.float(), wte, wpe)
    with pytest.raises(TypeError, match="dwte has dtype"):
        embedding_sum_bwd(idx, dx, wte.half(), wpe)
    with pytest.raises(ValueError, match="shapes do not agree"):
        embedding_sum_bwd(idx[:, :3].contiguous(), dx, torch.zeros_like(wte), torch.zeros_like(wpe))
    with pytest.raises(ValueError, match="b_run"):
        embedding_sum_bwd(idx, dx, torch.zeros_like(wte), torch.zeros_like(wpe), b_run=0)
    with pytest.raises(ValueError, match="sem='release'; expected one of"):
        embedding_sum_bwd(idx, dx, torch.zeros_like(wte), torch.zeros_like(wpe), sem="release")
    with pytest.raises(ValueError, match="sem='seq_cst'; expected one of"):
        embedding_sum(idx, wte, wpe, sem="seq_cst")
