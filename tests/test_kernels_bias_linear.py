"""Linear with a Triton bias gradient (kernels/bias_linear.py) vs F.linear, on kernel_device (tests/conftest.py:
the CPU interpreter, or compiled on CUDA with FTLIB_TEST_GPU=1); fp64 references on the CPU."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

pytest.importorskip("triton")

from kernels.bias_linear import BiasLinear, BiasLinearFunction, bias_grad, bias_grad_add_, bias_linear  # noqa: E402

pytestmark = pytest.mark.kernels


def _inputs(lead, K, N, device, dtype=torch.float32, seed=0):
    # Drawn on the CPU (the same values on every device), then moved.
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    x = mk(*lead, K).to(device, dtype).requires_grad_(True)
    w = (mk(N, K) / K**0.5).to(device, dtype).requires_grad_(True)
    # An offset, so a column sum that drops or double-counts rows is off by a visible amount.
    b = (mk(N) + 0.5).to(device, dtype).requires_grad_(True)
    dy = (mk(*lead, N) + 0.3).to(device, dtype)
    return x, w, b, dy



# Interpreter blocks are BLOCK_M = 8 rows x BLOCK_N = 16 columns: N = 40, 33, 29 leave partial
# column blocks; M = 5 (and 3) is less than one row tile; M = 37 and 300 span several tiles.
@pytest.mark.parametrize("lead,K,N", [((37,), 48, 40), ((2, 19), 64, 33), ((5,), 24, 29), ((300,), 16, 16)],
                         ids=["M37-N40", "3d-N33", "M5-N29", "M300-N16"])
def test_forward_and_every_gradient_match_f_linear(lead, K, N, kernel_device):
    x, w, b, dy = _inputs(lead, K, N, kernel_device)
    y = bias_linear(x, w, b)
    got = torch.autograd.grad(y, (x, w, b), dy)
    ref_in = [t.detach().cpu().double().requires_grad_(True) for t in (x, w, b)]
    yr = F.linear(*ref_in)
    want = torch.autograd.grad(yr, ref_in, dy.cpu().double())
    assert y.shape == (*lead, N) and y.dtype == torch.float32 and y.device == x.device
    torch.testing.assert_close(y.detach().cpu().double(), yr, atol=1e-5, rtol=1e-5)
    for name, a, c in zip(("dx", "dW", "db"), got, want):
        assert a.shape == c.shape and a.dtype == torch.float32, name
        torch.testing.assert_close(a.cpu().double(), c, atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("M,N", [(37, 40), (3, 17), (300, 64), (129, 1)])
def test_bias_grad_fp32_matches_column_sum(M, N, kernel_device):
    dy = torch.randn(M, N, generator=torch.Generator().manual_seed(M), dtype=torch.float64) + 0.3
    got = bias_grad(dy.float().to(kernel_device), torch.float32)
    assert got.shape == (N,) and got.dtype == torch.float32
    torch.testing.assert_close(got.cpu().double(), dy.float().double().sum(0), atol=1e-5, rtol=1e-5)


def test_bias_grad_bf16_accumulates_in_fp32(kernel_device):
    # 600 rows of values near 1: a bf16 running sum (8 mantissa bits) would be off by several units.
    g = torch.Generator().manual_seed(3)
    dy = (1 + 0.01 * torch.randn(600, 40, generator=g)).bfloat16()
    want = dy.double().sum(0).float()
    got = bias_grad(dy.to(kernel_device), torch.float32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-6)
    got_bf16 = bias_grad(dy.to(kernel_device), torch.bfloat16)
    assert got_bf16.dtype == torch.bfloat16
    torch.testing.assert_close(got_bf16.cpu(), want.bfloat16(), atol=0, rtol=0)  # one rounding, at the end


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_bias_grad_other_dtypes(dtype, kernel_device):
    dy = torch.randn(45, 20, generator=torch.Generator().manual_seed(4)).to(dtype)
    got = bias_grad(dy.to(kernel_device), dtype)
    assert got.dtype == dtype
    tol = 1e-12 if dtype == torch.float64 else 1e-2
    torch.testing.assert_close(got.cpu().double(), dy.double().sum(0).to(dtype).double(), atol=tol, rtol=tol)


@pytest.mark.parametrize("splits", [1, 2, 3, 5, 100])
def test_bias_grad_sums_every_split(splits, kernel_device):
    dy = torch.randn(37, 40, generator=torch.Generator().manual_seed(5)) + 0.3
    got = bias_grad(dy.to(kernel_device), torch.float32, splits=splits)
    torch.testing.assert_close(got.cpu(), dy.sum(0), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("blocks,per_sm", [((16, 16, 1), 1), ((8, 64, 2), 4), ((64, 8, 1), 8)])
def test_bias_grad_other_tiles_and_programs_per_sm(blocks, per_sm, kernel_device):
    # The tiles the dev driver times (benchmarks/kernels/bias_grad_dev.py): partial column and row
    # blocks at 37 x 40 with every tile shape.
    dy = torch.randn(37, 40, generator=torch.Generator().manual_seed(8)) - 0.2
    got = bias_grad(dy.to(kernel_device), torch.float32, blocks=blocks, per_sm=per_sm)
    torch.testing.assert_close(got.cpu(), dy.sum(0), atol=1e-5, rtol=1e-5)


def test_bias_grad_reads_strided_views(kernel_device):
    base = torch.randn(30, 50, generator=torch.Generator().manual_seed(6))
    dy = base[::2, 3:40]  # (15, 37): row stride 100, not N
    dy_dev = base.to(kernel_device)[::2, 3:40]
    assert dy_dev.stride() == (100, 1)
    torch.testing.assert_close(bias_grad(dy_dev, torch.float32).cpu(), dy.sum(0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bias_grad(dy_dev.t(), torch.float32).cpu(), dy.t().sum(0), atol=1e-5, rtol=1e-5)


def test_bias_grad_empty_rows(kernel_device):
    assert torch.equal(bias_grad(torch.zeros(0, 7, device=kernel_device), torch.float32).cpu(), torch.zeros(7))


def test_a_wrong_result_fails_the_comparison(kernel_device):
    dy = torch.randn(37, 40, generator=torch.Generator().manual_seed(7))
    got = bias_grad(dy.to(kernel_device), torch.float32).cpu()
    torch.testing.assert_close(got, dy.sum(0), atol=1e-5, rtol=1e-5)
    got[33] += 1e-3  # one column in the last, partial column block
    with pytest.raises(AssertionError):
        torch.testing.assert_close(got, dy.sum(0), atol=1e-5, rtol=1e-5)


def test_gradcheck_fp64(kernel_device):
    x, w, b, _ = _inputs((2, 3), 6, 5, kernel_device, dtype=torch.float64)
    assert torch.autograd.gradcheck(BiasLinearFunction.apply, (x, w, b))


@pytest.mark.parametrize("backward_in_autocast", [False, True], ids=["bwd-outside", "bwd-inside"])
def test_bf16_autocast_matches_f_linear_under_autocast(backward_in_autocast, kernel_device):
    # The reference is F.linear under the same autocast on the same device (cuBLAS or the CPU's
    # bf16 GEMM), so both sides round the same operands.
    dev_type = kernel_device.type
    x, w, b, dy = _inputs((2, 19), 64, 40, kernel_device)
    ref_in = [t.detach().clone().requires_grad_(True) for t in (x, w, b)]
    with torch.autocast(dev_type, dtype=torch.bfloat16):
        y = bias_linear(x, w, b)
        yr = F.linear(*ref_in)
        if backward_in_autocast:
            got = torch.autograd.grad(y, (x, w, b), dy.bfloat16())
            want = torch.autograd.grad(yr, ref_in, dy.bfloat16())
    if not backward_in_autocast:
        got = torch.autograd.grad(y, (x, w, b), dy.bfloat16())
        want = torch.autograd.grad(yr, ref_in, dy.bfloat16())
    assert y.dtype == yr.dtype == torch.bfloat16
    torch.testing.assert_close(y, yr, atol=1e-2, rtol=1.6e-2)
    for name, a, c in zip(("dx", "dW", "db"), got, want):
        assert a.dtype == c.dtype == torch.float32, name  # each gradient in its input's dtype
        torch.testing.assert_close(a, c, atol=2e-2, rtol=1.6e-2, msg=lambda m, n=name: f"{n}: {m}")
    # db is the fp32 sum of the bf16 dy, not a bf16-rounded one.
    torch.testing.assert_close(got[2].cpu(), dy.cpu().bfloat16().double().reshape(-1, 40).sum(0).float(), atol=1e-5,
                               rtol=1e-5)
    # The Function itself returns the original dtypes (autograd's engine would also cast them,
    # so check its backward directly).
    with torch.autocast(dev_type, dtype=torch.bfloat16):
        y = bias_linear(x, w, b)
    assert all(g.dtype == torch.float32 for g in y.grad_fn.apply(dy.bfloat16()))


def _assert_close_report(name, got, want64, tol=1e-5):
    """|got - want| <= tol * (1 + |want|) elementwise, or an AssertionError that shows where it ran,
    the largest error against its tolerance, and both tensors."""
    got64 = got.detach().cpu().double()
    assert got64.shape == want64.shape, f"{name}: shape {tuple(got64.shape)}, expected {tuple(want64.shape)}"
    err = (got64 - want64).abs()
    allowed = tol * (1 + want64.abs())
    worst = int((err - allowed).flatten().argmax())
    assert bool((err <= allowed).all()), (
        f"{name} on {got.device} ({got.dtype}): max |error| {err.max().item():.3g}, at flat index {worst} "
        f"error {err.flatten()[worst].item():.3g} > allowed {allowed.flatten()[worst].item():.3g}\n"
        f"got  {got64.flatten()[:16].tolist()}\nwant {want64.flatten()[:16].tolist()}")


def test_only_needed_gradients_are_computed(kernel_device):
    x, w, b, dy = _inputs((7,), 12, 9, kernel_device)
    x.requires_grad_(False)
    want_dw = dy.cpu().double().t() @ x.detach().cpu().double()  # (N, K)
    want_db = dy.cpu().double().sum(0)  # (N,)
    y = bias_linear(x, w, b)
    got = y.grad_fn.apply(dy)  # the Function's backward, as autograd calls it
    assert [g is None for g in got] == [True, False, False], \
        f"direct backward on {kernel_device}: (dx, dW, db) is None = {[g is None for g in got]}"
    _assert_close_report("direct backward's dW", got[1], want_dw)
    _assert_close_report("direct backward's db", got[2], want_db)
    y.backward(dy)  # and through autograd: no crash, x gets no gradient
    assert x.grad is None, f"x, which needs no gradient, got one on {kernel_device}"
    _assert_close_report("w.grad through autograd", w.grad, want_dw)
    _assert_close_report("b.grad through autograd", b.grad, want_db)
    w.requires_grad_(False)
    # The output is kept alive: in torch releases whose ctx (grad_fn) holds its autograd node only
    # weakly, a temporary output's death destroys the node, and that frees the saved tensors
    # ("backward through the graph a second time"), whatever the device.
    y = bias_linear(x, w, b)
    got = y.grad_fn.apply(dy)
    assert [g is None for g in got] == [True, True, False], \
        f"backward with only b needing a gradient on {kernel_device}: (dx, dW, db) is None = {[g is None for g in got]}"
    _assert_close_report("db with only b needing a gradient", got[2], want_db)


def test_launcher_and_function_reject_bad_arguments(kernel_device):
    dev = kernel_device
    dy = torch.randn(8, 4, device=dev)
    with pytest.raises(ValueError, match="dy2d must have 2 dims"):
        bias_grad(torch.randn(8, device=dev), torch.float32)
    with pytest.raises(TypeError, match="dy2d has dtype torch.int64"):
        bias_grad(torch.ones(8, 4, dtype=torch.int64, device=dev), torch.float32)
    with pytest.raises(TypeError, match="out_dtype"):
        bias_grad(dy, torch.int32)
    with pytest.raises(ValueError, match="splits must be >= 1"):
        bias_grad(dy, torch.float32, splits=0)
    with pytest.raises(ValueError, match="per_sm must be >= 1"):
        bias_grad(dy, torch.float32, per_sm=0)
    with pytest.raises(ValueError, match="Triton kernels need a CUDA tensor"):
        bias_grad(torch.empty(8, 4, device="meta"), torch.float32)
    x, w, b = torch.randn(3, 6, device=dev), torch.randn(4, 6, device=dev), torch.randn(4, device=dev)
    with pytest.raises(ValueError, match="different devices"):
        bias_linear(x, w.to("meta"), b)
    with pytest.raises(ValueError, match="in_features 6"):
        bias_linear(torch.randn(3, 5, device=dev), w, b)
    with pytest.raises(ValueError, match="bias must be \\(4,\\)"):
        bias_linear(x, w, torch.randn(5, device=dev))
    with pytest.raises(TypeError, match="bias must be a torch.Tensor"):
        bias_linear(x, w, None)
    with pytest.raises(TypeError, match="share a dtype"):
        bias_linear(x.double(), w, b)


def test_module_shares_parameters_and_matches_nn_linear(kernel_device):
    torch.manual_seed(0)
    lin = nn.Linear(24, 40)
    ref = nn.Linear(24, 40)
    ref.load_state_dict(lin.state_dict())  # the CPU reference
    lin.to(kernel_device)
    mod = BiasLinear(lin)
    assert mod.weight is lin.weight and mod.bias is lin.bias
    assert dict(mod.named_parameters()).keys() == {"weight", "bias"}
    assert "in_features=24, out_features=40" in repr(mod)
    x = torch.randn(3, 5, 24)
    dy = torch.randn(3, 5, 40)
    y = mod(x.to(kernel_device))
    torch.testing.assert_close(y.detach().cpu(), ref(x).detach(), atol=1e-5, rtol=1e-5)
    y.backward(dy.to(kernel_device))
    xd, dyd = x.double(), dy.double()
    torch.testing.assert_close(lin.bias.grad.cpu(), dyd.sum((0, 1)).float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lin.weight.grad.cpu(), (dyd.reshape(-1, 40).t() @ xd.reshape(-1, 24)).float(),
                               atol=1e-5, rtol=1e-5)


def test_module_rejects_linear_without_bias():
    with pytest.raises(ValueError, match="needs an nn.Linear with a bias"):
        BiasLinear(nn.Linear(8, 4, bias=False))


# bias_grad_add_: the one-stage form that adds the column sums into an existing fp32 buffer with atomic adds
# (the engine's flat gradient, option bias_into_buffer).
@pytest.mark.parametrize("M,N,dtype,splits", [(37, 40, torch.float32, None), (300, 33, torch.bfloat16, None),
                                              (37, 40, torch.float32, 5), (3, 17, torch.float16, 1),
                                              (129, 64, torch.bfloat16, 100)],
                         ids=["M37-N40", "bf16-M300-N33", "5-splits", "fp16-one-split", "bf16-many-splits"])
def test_bias_grad_add_adds_the_column_sums_into_the_buffer(M, N, dtype, splits, kernel_device):
    g = torch.Generator().manual_seed(M + N)
    dy = (torch.randn(M, N, generator=g) + 0.3).to(dtype)
    before = torch.randn(N, generator=g)  # what the buffer holds already: a kernel that wrote would lose it
    out = before.to(kernel_device, copy=True)
    got = bias_grad_add_(dy.to(kernel_device), out, splits=splits)
    assert got is out and out.dtype == torch.float32 and out.shape == (N,)
    want = before.double() + dy.double().sum(0)
    torch.testing.assert_close(out.cpu().double(), want, atol=1e-4, rtol=1e-5)
    # The same sum as the two-stage launcher, to fp32 rounding (the adds come in another order).
    torch.testing.assert_close(out.cpu() - before, bias_grad(dy.to(kernel_device), torch.float32).cpu(),
                               atol=1e-4, rtol=1e-5)


def test_bias_grad_add_fp64_strided_and_empty(kernel_device):
    base = torch.randn(30, 50, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    dy = base.to(kernel_device)[::2, 3:40]  # (15, 37), row stride 100
    out = torch.zeros(37, dtype=torch.float64, device=kernel_device)
    bias_grad_add_(dy, out, blocks=(8, 64, 2), per_sm=4)
    torch.testing.assert_close(out.cpu(), base[::2, 3:40].sum(0), atol=1e-12, rtol=1e-12)
    out = torch.ones(7, device=kernel_device)
    bias_grad_add_(torch.zeros(0, 7, device=kernel_device), out)
    assert torch.equal(out.cpu(), torch.ones(7))  # no rows: nothing added


def test_bias_grad_add_rejects_bad_destinations(kernel_device):
    dev = kernel_device
    dy = torch.randn(8, 4, device=dev)
    with pytest.raises(ValueError, match=r"db_out must be \(4,\) torch.float32"):
        bias_grad_add_(dy, torch.zeros(5, device=dev))
    with pytest.raises(ValueError, match=r"db_out must be \(4,\) torch.float32"):
        bias_grad_add_(dy.bfloat16(), torch.zeros(4, dtype=torch.bfloat16, device=dev))  # sums stay fp32
    with pytest.raises(ValueError, match="db_out must be contiguous"):
        bias_grad_add_(dy, torch.zeros(8, device=dev)[::2])
    with pytest.raises(ValueError, match="db_out must have 1 dims"):
        bias_grad_add_(dy, torch.zeros(1, 4, device=dev))
    with pytest.raises(ValueError, match="splits must be >= 1"):
        bias_grad_add_(dy, torch.zeros(4, device=dev), splits=0)
