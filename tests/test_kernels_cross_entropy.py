"""Fused cross-entropy kernel vs ftlib.reference.cross_entropy_ref (CPU interpreter)."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # must precede the first `import triton` (see kernels/README.md)

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")

from kernels._common import interpreter_ready  # noqa: E402

# When triton was imported before TRITON_INTERPRET=1 (torch imports it in some test modules),
# this process cannot interpret kernels (tests/conftest.py sets TRITON_INTERPRET before triton loads).
pytestmark = pytest.mark.skipif(not interpreter_ready(), reason="triton imported before TRITON_INTERPRET=1")

from ftlib.reference import cross_entropy_ref  # noqa: E402
from kernels.cross_entropy import (  # noqa: E402
    MAX_BLOCK_V,
    CrossEntropyFunction,
    TritonCrossEntropyLoss,
    cross_entropy,
    cross_entropy_fwd,
)

TOL = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 1e-3}


def _inputs(n, v, dtype, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    z = (scale * torch.randn(n, v, generator=g, dtype=torch.float64)).to(dtype).requires_grad_(True)
    t = torch.randint(0, v, (n,), generator=g)
    return z, t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 37, 64])
def test_matches_reference_v65(n, dtype):
    z, t = _inputs(n, 65, dtype)
    loss = cross_entropy(z, t)
    (dz,) = torch.autograd.grad(2.5 * loss, z)  # grad_output != 1 exercises the backward scale
    zr = z.detach().double().requires_grad_(True)
    lr = cross_entropy_ref(zr, t)
    (dzr,) = torch.autograd.grad(2.5 * lr, zr)
    tol = TOL[dtype]
    assert loss.dtype == torch.float32 and dz.dtype == dtype
    torch.testing.assert_close(loss.double(), lr, atol=tol, rtol=tol)
    torch.testing.assert_close(dz.double(), dzr, atol=tol / n, rtol=tol * 10)


def test_ignore_index_and_large_logits():
    z, t = _inputs(9, 65, torch.float32, seed=1, scale=30.0)  # large logits: max-subtraction matters
    t[[0, 4, 8]] = -100
    loss = cross_entropy(z, t)
    (dz,) = torch.autograd.grad(loss, z)
    zr = z.detach().requires_grad_(True)
    lr = cross_entropy_ref(zr, t)
    (dzr,) = torch.autograd.grad(lr, zr)
    torch.testing.assert_close(loss, lr, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(dz, dzr, atol=1e-7, rtol=1e-5)
    assert (dz[[0, 4, 8]] == 0).all()


def test_vocab_larger_than_one_block():
    v = MAX_BLOCK_V + 77  # two blocks: exercises the online max/sum across blocks
    z, t = _inputs(3, v, torch.float32, seed=2)
    loss, dz = cross_entropy_fwd(z.detach(), t)
    zr = z.detach().requires_grad_(True)
    lr = cross_entropy_ref(zr, t)
    (dzr,) = torch.autograd.grad(lr, zr)
    torch.testing.assert_close(loss, lr, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(dz, dzr, atol=1e-8, rtol=1e-5)


def test_gradcheck_fp64():
    z, t = _inputs(5, 7, torch.float64, seed=3)
    assert torch.autograd.gradcheck(lambda a: CrossEntropyFunction.apply(a, t, -100), (z,))


def test_module_and_strided_rows():
    z, t = _inputs(6, 130, torch.float32, seed=4)
    zs = z.detach()[:, :65]  # row stride 130: accepted without a copy
    torch.testing.assert_close(TritonCrossEntropyLoss()(zs, t % 65), cross_entropy_ref(zs, t % 65))


def test_wrong_inputs_raise():
    z, t = _inputs(4, 65, torch.float32)
    with pytest.raises(TypeError, match="targets has dtype"):
        cross_entropy(z, t.float())
    with pytest.raises(ValueError, match="2 dims"):
        cross_entropy(z.view(2, 2, 65), t)
    with pytest.raises(ValueError, match="entries"):
        cross_entropy(z, t[:3])
    with pytest.raises(ValueError, match="last dim"):
        cross_entropy(torch.randn(65, 4).t(), t)


def test_detects_a_wrong_target():
    z, t = _inputs(8, 65, torch.float32)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(cross_entropy(z, (t + 1) % 65), cross_entropy_ref(z, t))
