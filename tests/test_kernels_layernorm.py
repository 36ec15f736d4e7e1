"""LayerNorm Triton kernel vs ftlib.model.reference.layer_norm_ref, on kernel_device (tests/conftest.py: the CPU
interpreter, or compiled on CUDA with FTLIB_TEST_GPU=1); references in fp64 on the CPU."""

import pytest
import torch

pytest.importorskip("triton")

from kernel_tolerance import assert_within_lowp_error  # noqa: E402

from ftlib.model.reference import layer_norm_ref  # noqa: E402
from kernels.layernorm import LayerNormFunction, TritonLayerNorm, layer_norm  # noqa: E402

pytestmark = pytest.mark.kernels

def _inputs(shape, dtype, bias, device, seed=0):
    # Drawn on the CPU (the same values on every device), then moved.
    g = torch.Generator().manual_seed(seed)
    mk = lambda t: t.to(device, dtype).requires_grad_(True)  # noqa: E731
    x = mk(2 + torch.randn(shape, generator=g, dtype=torch.float64))  # mean != 0
    w = mk(1 + 0.1 * torch.randn(shape[-1], generator=g, dtype=torch.float64))
    b = mk(0.1 * torch.randn(shape[-1], generator=g, dtype=torch.float64))
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(device, dtype)
    return x, w, (b if bias else None), dy


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(7, 48), (2, 5, 33), (37, 64)])
def test_forward_backward_match_reference(shape, dtype, bias, kernel_device):
    x, w, b, dy = _inputs(shape, dtype, bias, kernel_device)
    y = layer_norm(x, w, b, 1e-5)
    inputs = (x, w) + ((b,) if bias else ())
    grads = torch.autograd.grad(y, inputs, dy)
    ref_inputs = [t.detach().cpu().double().requires_grad_(True) for t in inputs]
    yr = layer_norm_ref(ref_inputs[0], ref_inputs[1], ref_inputs[2] if bias else None, 1e-5)
    ref_grads = torch.autograd.grad(yr, ref_inputs, dy.cpu().double())
    # PyTorch's own op in the same dtype from the same inputs: the error a correct implementation
    # makes, which sets the bound (tests/kernel_tolerance.py).
    low_inputs = [t.detach().cpu().requires_grad_(True) for t in inputs]
    yl = layer_norm_ref(low_inputs[0], low_inputs[1], low_inputs[2] if bias else None, 1e-5)
    low_grads = torch.autograd.grad(yl, low_inputs, dy.cpu())
    assert y.dtype == dtype and y.device == x.device
    assert_within_lowp_error(y, yr, yl, "y")
    for name, gk, gr, gl in zip(("dx", "dweight", "dbias"), grads, ref_grads, low_grads):
        assert gk.dtype == dtype
        assert_within_lowp_error(gk, gr, gl, name)
    # The bound can fail: a weight gradient 4% off (uniformly) is caught in every dtype.
    with pytest.raises(AssertionError, match="dweight"):
        assert_within_lowp_error(grads[1] * 1.04, ref_grads[1], low_grads[1], "dweight")


@pytest.mark.parametrize("bias", [True, False])
def test_gradcheck_fp64(bias, kernel_device):
    x, w, b, _ = _inputs((3, 9), torch.float64, bias, kernel_device)
    assert torch.autograd.gradcheck(lambda *a: LayerNormFunction.apply(*a, 1e-5), (x, w, b))


def test_module_matches_ftlib_module(kernel_device):
    from ftlib.model.norm import LayerNorm

    ref, mod = LayerNorm(24), TritonLayerNorm(24).to(kernel_device)
    with torch.no_grad():
        ref.weight.normal_()
        ref.bias.normal_()
        mod.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 24)
    torch.testing.assert_close(mod(x.to(kernel_device)).cpu(), ref(x), atol=1e-5, rtol=1e-5)


def test_wrong_inputs_raise(monkeypatch, kernel_device):
    dev = kernel_device
    with pytest.raises(ValueError, match="last dim"):
        layer_norm(torch.randn(32, 6, device=dev).t(), torch.randn(32, device=dev))
    with pytest.raises(TypeError, match="dtype"):
        layer_norm(torch.randn(4, 8, device=dev), torch.randint(0, 3, (8,), device=dev))
    with pytest.raises(ValueError, match="bias shape"):
        layer_norm(torch.randn(4, 8, device=dev), torch.randn(8, device=dev), torch.randn(7, device=dev))
    # CPU tensors on purpose: without the interpreter they are rejected, in either test mode.
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="CUDA"):
        layer_norm(torch.randn(4, 8), torch.randn(8))


def test_detects_a_wrong_bias(kernel_device):
    x, w, b, _ = _inputs((4, 16), torch.float32, True, kernel_device)
    want = layer_norm_ref(x.detach().cpu(), w.detach().cpu(), b.detach().cpu(), 1e-5)
    torch.testing.assert_close(layer_norm(x.detach(), w.detach(), b.detach()).cpu(), want, atol=1e-5, rtol=1e-5)
    y = layer_norm(x.detach(), w.detach(), b.detach() + 1e-3)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(y.cpu(), want, atol=1e-5, rtol=1e-5)
