"""The split-K weight gradient with atomic adds (kernels/wgrad.py) against the plain-PyTorch reference
(ftlib.model.reference.wgrad_ref) on kernel_device (tests/conftest.py: the CPU interpreter, or compiled on
CUDA with FTLIB_TEST_GPU=1): the sum is added (not written), every row counted once however the rows are
sliced, strided operands read in place, and the argument checks."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from ftlib.model.reference import wgrad_ref  # noqa: E402
from kernels._common import ATOMIC_SEMS  # noqa: E402
from kernels.wgrad import wgrad_add_  # noqa: E402

pytestmark = pytest.mark.kernels

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-5, torch.float16: 1e-5}  # fp32 sums of exact products


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-12)).item()


def _operands(M, N, K, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(M, N, generator=g).to(device, dtype), torch.randn(M, K, generator=g).to(device, dtype))


# (M, N, K): shapes off every tile multiple; M long enough that the rows are cut into several slices
# (the interpreter's grid: 4 SMs, 16-row steps), and one with fewer rows than a step.
@pytest.mark.parametrize("M,N,K", [(200, 24, 40), (37, 16, 16), (9, 33, 20)])
@pytest.mark.parametrize("dtype,prec", [(torch.float32, "ieee"), (torch.float32, "tf32"), (torch.bfloat16, "ieee"),
                                        (torch.float16, "ieee")])
@pytest.mark.parametrize("sem", ATOMIC_SEMS)
def test_adds_the_weight_gradient(kernel_device, M, N, K, dtype, prec, sem):
    a, b = _operands(M, N, K, dtype, kernel_device)
    start = torch.randn(N, K, generator=torch.Generator().manual_seed(5)).to(kernel_device)
    c = start.clone()
    assert wgrad_add_(c, a, b, prec, sem) is c
    tol = 5e-3 if prec == "tf32" else TOL[dtype]  # TF32 products: 10 explicit mantissa bits
    want = start.double() + wgrad_ref(a, b)
    assert _rel(c, want) < tol, "the gradient is added onto what c held"
    # Twice: the second call adds the same sum again (a kernel that wrote instead would give start + dW).
    wgrad_add_(c, a, b, prec, sem)
    assert _rel(c, start.double() + 2 * wgrad_ref(a, b)) < tol


def test_reads_strided_operands_in_place(kernel_device):
    """The engine hands in dy and x as views (a reshape of a (B, T, C) tensor, a column slice of the packed
    qkv gradient): the kernel reads them through their strides."""
    M, N, K = 64, 24, 20
    wide, b = _operands(M, 3 * N, K, torch.float32, kernel_device)
    a = wide[:, N : 2 * N]  # a column slice: stride (3N, 1)
    bt = b.t().contiguous().t()  # column-major: stride (1, M)
    c = torch.zeros(N, K, device=kernel_device)
    wgrad_add_(c, a, bt)
    assert _rel(c, wgrad_ref(a, b)) < 1e-5


def test_checks_its_arguments(kernel_device):
    a, b = _operands(8, 4, 6, torch.bfloat16, kernel_device)
    c = torch.zeros(4, 6, device=kernel_device)
    with pytest.raises(TypeError, match="c has dtype"):
        wgrad_add_(c.bfloat16(), a, b)
    with pytest.raises(TypeError, match="share a dtype"):
        wgrad_add_(c, a, b.float())
    with pytest.raises(ValueError, match="need a \\(M, N\\)"):
        wgrad_add_(torch.zeros(6, 4, device=kernel_device), a, b)
    with pytest.raises(ValueError, match="input_precision"):
        wgrad_add_(c, a, b, "fast")
    with pytest.raises(ValueError, match="sem='release'; expected one of"):
        wgrad_add_(c, a, b, sem="release")
    with pytest.raises(ValueError, match="contiguous"):
        wgrad_add_(torch.zeros(6, 4, device=kernel_device).t(), a, b)
