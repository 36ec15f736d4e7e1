"""LayerNorm Triton kernel vs ftlib.reference.layer_norm_ref, on the CPU via the Triton interpreter."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # must precede the first `import triton` (see kernels/README.md)

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")

from kernels._common import interpreter_ready  # noqa: E402

# When triton was imported before TRITON_INTERPRET=1 (torch imports it in some test modules),
# this process cannot interpret kernels (tests/conftest.py sets TRITON_INTERPRET before triton loads).
pytestmark = pytest.mark.skipif(not interpreter_ready(), reason="triton imported before TRITON_INTERPRET=1")

from ftlib.reference import layer_norm_ref  # noqa: E402
from kernels.layernorm import LayerNormFunction, TritonLayerNorm, layer_norm  # noqa: E402

TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _inputs(shape, dtype, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (2 + torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype).requires_grad_(True)  # mean != 0
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g, dtype=torch.float64)).to(dtype).requires_grad_(True)
    b = (0.1 * torch.randn(shape[-1], generator=g, dtype=torch.float64)).to(dtype).requires_grad_(True)
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return x, w, (b if bias else None), dy


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(7, 48), (2, 5, 33)])
def test_forward_backward_match_reference(shape, dtype, bias):
    x, w, b, dy = _inputs(shape, dtype, bias)
    y = layer_norm(x, w, b, 1e-5)
    inputs = (x, w) + ((b,) if bias else ())
    grads = torch.autograd.grad(y, inputs, dy)
    ref_inputs = [t.detach().double().requires_grad_(True) for t in inputs]
    yr = layer_norm_ref(ref_inputs[0], ref_inputs[1], ref_inputs[2] if bias else None, 1e-5)
    ref_grads = torch.autograd.grad(yr, ref_inputs, dy.double())
    tol = TOL[dtype]
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), yr, atol=tol, rtol=tol)
    rows = x.numel() // shape[-1]
    for name, gk, gr, scale in zip(("dx", "dweight", "dbias"), grads, ref_grads, (4, 4 * rows, 4 * rows)):
        assert gk.dtype == dtype
        torch.testing.assert_close(gk.double(), gr, atol=tol * scale, rtol=tol, msg=name)


@pytest.mark.parametrize("bias", [True, False])
def test_gradcheck_fp64(bias):
    x, w, b, _ = _inputs((3, 9), torch.float64, bias)
    assert torch.autograd.gradcheck(lambda *a: LayerNormFunction.apply(*a, 1e-5), (x, w, b))


def test_module_matches_ftlib_module():
    from ftlib.norm import LayerNorm

    ref, mod = LayerNorm(24), TritonLayerNorm(24)
    with torch.no_grad():
        ref.weight.normal_()
        ref.bias.normal_()
        mod.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 24)
    torch.testing.assert_close(mod(x), ref(x), atol=1e-5, rtol=1e-5)


def test_wrong_inputs_raise(monkeypatch):
    with pytest.raises(ValueError, match="last dim"):
        layer_norm(torch.randn(32, 6).t(), torch.randn(32))
    with pytest.raises(TypeError, match="dtype"):
        layer_norm(torch.randn(4, 8), torch.randint(0, 3, (8,)))
    with pytest.raises(ValueError, match="bias shape"):
        layer_norm(torch.randn(4, 8), torch.randn(8), torch.randn(7))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="CUDA"):
        layer_norm(torch.randn(4, 8), torch.randn(8))


def test_detects_a_wrong_bias():
    x, w, b, _ = _inputs((4, 16), torch.float32, True)
    y = layer_norm(x.detach(), w.detach(), b.detach() + 1e-3)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(y, layer_norm_ref(x.detach(), w.detach(), b.detach(), 1e-5), atol=1e-5, rtol=1e-5)
