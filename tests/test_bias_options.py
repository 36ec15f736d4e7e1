"""The engine's bias options (``ftlib.training.engine.linears``): ``bias_into_buffer`` (each bias gradient added
into the flat gradient by the column sum's atomic adds) and ``bf16_bias_weights`` (the bias-kernel Linears read
their weight and bias from the step's bf16 shadow), and ``branch_bias_into_norm`` (the output projections' bias
gradients added by the residual-norm backward), all on by default. Each, alone on the engine without the four
bias and first-norm options and without ``fc_bias_into_gelu`` (tests/test_bias_sum_options.py), trains like that
engine, removes the ops it says it removes, and says where it does not apply."""

from __future__ import annotations

import collections

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from ftlib.harness.engine_check import pattern_batches
from ftlib.harness.suites import BIAS_OPTIONS_OFF
from ftlib.model.config import preset
from ftlib.training.engine import Engine, EngineOptions, grad_into

pytest.importorskip("triton")

B, T = 1, 16
GPT = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=T)  # four Linears with a bias
FT = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T)  # none
N_BIAS = 4

pytestmark = pytest.mark.usefixtures("results_root")  # results under tmp_path (conftest)


def _engine(cfg, prec: str, dev, b: int = B, **options) -> Engine:
    """The engine without the bias, first-norm and GELU bias-sum options but those in ``options``: each is tested
    alone."""
    # lr 1e-2: a gradient off anywhere moves the next steps' parameters far beyond rounding.
    return Engine(cfg, b, cfg.block_size, prec, dev, seed=4, lr=1e-2, capture=False,
                  **{**BIAS_OPTIONS_OFF, "fc_bias_into_gelu": False, **options})


def _steps(eng: Engine, n: int, seed: int = 7) -> list[float]:
    batches = pattern_batches(GPT.vocab_size, eng.B, eng.T, n, seed=seed, device=eng.device)
    return [float(eng.step(x, y)) for x, y in batches]


def _biased(eng: Engine) -> list[grad_into.GradIntoLinear]:
    return [m for m in eng.model.modules() if isinstance(m, grad_into.GradIntoLinear) and m.bias is not None]


def _op_counts(eng: Engine) -> collections.Counter:
    _steps(eng, 1, seed=9)
    (x, y), = pattern_batches(GPT.vocab_size, eng.B, eng.T, 1, seed=9, device=eng.device)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        eng.step(x, y)
    return collections.Counter(e.name for e in prof.events())


def _default_sums(rows: int, widths: list[int], dev) -> int:
    """The torch sums the default bias gradients of Linears this wide take at ``rows`` rows: one per bias whose
    column sum leaves several partial rows (kernels/bias_linear.bias_grad). At the tests' 64 rows the interpreter
    splits them; a GPU's column sum covers them in one partial row, and takes no sum."""
    from kernels.bias_linear import bias_grad

    n = 0
    for w in widths:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            bias_grad(torch.ones(rows, w, device=dev), torch.float32)
        n += sum(e.name == "aten::sum" for e in prof.events())
    return n


@pytest.mark.parametrize("prec", ["fp32", "bf16"])  # tf32 is fp32 on the CPU
def test_bias_into_buffer_trains_like_the_default(prec, kernel_device, monkeypatch):
    import kernels.bias_linear as BL

    calls = []
    real = BL.bias_grad_add_
    monkeypatch.setattr(BL, "bias_grad_add_", lambda dy, out, **k: calls.append(out.data_ptr()) or real(dy, out, **k))
    default, on = _engine(GPT, prec, kernel_device), _engine(GPT, prec, kernel_device, bias_into_buffer=True)
    assert on.describe()["bias_into_buffer"] and not default.describe()["bias_into_buffer"]
    assert "added into the flat gradient" in on.notes["bias_into_buffer"]
    assert len(_biased(on)) == N_BIAS and all(m.db_out is not None for m in _biased(on))
    # Step 1 from the same weights: the same gradients, the biases' summed in another order.
    _steps(default, 1), _steps(on, 1)
    assert sorted(calls) == sorted(m.bias.grad.data_ptr() for m in _biased(on))  # each bias's own view, once
    for name, (off, size) in on.spans.items():
        got, want = on.flat_grad[off:off + size], default.flat_grad[off:off + size]
        assert want.abs().sum() > 0, name
        err = ((got - want).norm() / want.norm()).item()
        assert err < 1e-5, (name, err)
    # Then three more steps: the losses follow (a bias gradient that went nowhere would not: lr 1e-2).
    torch.testing.assert_close(torch.tensor(_steps(on, 3)), torch.tensor(_steps(default, 3)), rtol=1e-4, atol=1e-4)


def test_bias_into_buffer_removes_the_sum_and_the_add_per_bias(kernel_device):
    # 64 rows: the interpreter's column sum splits them into two parts, whose partial rows the default sums with
    # torch (the ops counted are the profiler's CPU-side ops, on either device).
    default = _engine(GPT, "fp32", kernel_device, b=4)
    a = _op_counts(default)
    b = _op_counts(_engine(GPT, "fp32", kernel_device, b=4, bias_into_buffer=True))
    adds = ("aten::add_", "aten::add")
    assert sum(a[k] for k in adds) - sum(b[k] for k in adds) == N_BIAS, (a, b)  # AccumulateGrad's adds
    sums = _default_sums(64, [m.out_features for m in _biased(default)], kernel_device)
    assert sums == (N_BIAS if kernel_device.type == "cpu" else 0)
    assert a["aten::sum"] - b["aten::sum"] == sums  # the partial rows' torch sums, where the default takes them
    assert a["aten::mm"] + a["aten::addmm"] == b["aten::mm"] + b["aten::addmm"]  # no GEMM added


def test_bf16_bias_weights_reads_the_shadow_and_computes_the_same(kernel_device):
    default, on = _engine(GPT, "bf16", kernel_device), _engine(GPT, "bf16", kernel_device, bf16_bias_weights=True)
    assert on.describe()["bf16_bias_weights"] and not default.describe()["bf16_bias_weights"]
    # The default shadows no bias-kernel Linear; with the option the shadow covers the whole flat buffer
    # and every bias-kernel Linear reads its weight and bias from it.
    assert default.flat_param16.numel() == default.n_decay and all(m.w16 is None for m in _biased(default))
    assert on.flat_param16.numel() == on.flat_param.numel()
    lo, hi = on.flat_param16.data_ptr(), on.flat_param16.data_ptr() + 2 * on.flat_param16.numel()
    for m in _biased(on):
        assert m.w16 is not None and m.b16 is not None
        assert all(lo <= t.data_ptr() < hi for t in (m.w16, m.b16))
    # bf16(W) and bf16(b) from the shadow are autocast's casts: the same step, bit for bit on the CPU.
    la, lb = _steps(default, 3), _steps(on, 3)
    if kernel_device.type == "cpu":
        assert la == lb and torch.equal(on.flat_param, default.flat_param)
    else:
        assert lb == pytest.approx(la, rel=1e-3)
    # Each step refreshes the whole shadow from the weights it starts from, the biases included.
    before = on.flat_param.clone()
    _steps(on, 1, seed=11)
    assert torch.equal(on.flat_param16, before.bfloat16()) and not torch.equal(on.flat_param, before)


def test_bf16_bias_weights_removes_two_casts_per_biased_linear(kernel_device):
    a = _op_counts(_engine(GPT, "bf16", kernel_device))
    b = _op_counts(_engine(GPT, "bf16", kernel_device, bf16_bias_weights=True))
    assert a["aten::_to_copy"] - b["aten::_to_copy"] == 2 * N_BIAS, (a["aten::_to_copy"], b["aten::_to_copy"])


def test_where_the_bias_options_do_not_apply(kernel_device):
    both = dict(bias_into_buffer=True, bf16_bias_weights=True)
    eng = _engine(FT, "bf16", kernel_device, **both)
    assert not eng.describe()["bias_into_buffer"] and not eng.describe()["bf16_bias_weights"]
    assert eng.notes["bias_into_buffer"].startswith("not applicable: no Linear on the bias kernel")
    eng = _engine(GPT, "bf16", kernel_device, grad_into_buffer=False, **both)
    assert not eng.describe()["bias_into_buffer"]
    assert eng.notes["bias_into_buffer"] == "not applied: needs grad_into_buffer"
    assert eng.flat_param16.numel() == eng.n_decay  # no whole-buffer shadow without the Linears that read it
    eng = _engine(GPT, "tf32", kernel_device, **both)
    assert eng.describe()["bias_into_buffer"] and not eng.describe()["bf16_bias_weights"]
    assert eng.notes["bf16_bias_weights"] == "not applied: needs bf16 with bf16_weights" and eng.flat_param16 is None
    eng = _engine(GPT, "bf16", kernel_device, bias_kernel=False, **both)
    assert not eng.describe()["bias_into_buffer"] and "no Linear on the bias kernel" in eng.notes["bf16_bias_weights"]
    # Defaults: they won their trial (chapter 6).
    assert EngineOptions().bias_into_buffer is True and EngineOptions().bf16_bias_weights is True


# branch_bias_into_norm: the projections' bias gradients added by the residual-norm backward that makes their dy.
DROP = GPT.replace(dropout=0.1, attn_dropout=0.0)  # the residual dropout inside the fused norm: dr is masked


@pytest.mark.parametrize("cfg,prec", [(GPT, "fp32"), (GPT, "bf16"), (DROP, "fp32")],
                         ids=["fp32", "bf16", "fp32-residual-dropout"])
def test_branch_bias_into_norm_trains_like_the_default(cfg, prec, kernel_device):
    default, on = _engine(cfg, prec, kernel_device), _engine(cfg, prec, kernel_device, branch_bias_into_norm=True)
    assert on.describe()["branch_bias_into_norm"] and not default.describe()["branch_bias_into_norm"]
    taken = [m for m in _biased(on) if m.db_elsewhere]
    assert {id(m.bias) for m in taken} == {id(b.attn.proj.bias) for b in on.model.blocks} | {
        id(b.mlp.proj.bias) for b in on.model.blocks}
    for eng in (default, on):  # the embedding's dropout draws from torch's generator: the same draws for both
        torch.manual_seed(0)
        _steps(eng, 1)
    for name, (off, size) in on.spans.items():
        got, want = on.flat_grad[off:off + size], default.flat_grad[off:off + size]
        assert want.abs().sum() > 0, name
        # bf16: the kernel sums dr in fp32 before it is rounded to bf16; the default sums the rounded dr.
        tol = 1e-2 if prec == "bf16" and name.endswith("proj.bias") else 1e-5
        assert ((got - want).norm() / want.norm()).item() < tol, name
    losses = []
    for eng in (on, default):
        torch.manual_seed(1)
        losses.append(torch.tensor(_steps(eng, 3)))
    torch.testing.assert_close(*losses, rtol=1e-3, atol=1e-3)


def test_branch_bias_into_norm_removes_two_column_sums_per_block(kernel_device):
    # 64 rows: the interpreter's column sums leave two partial rows each for the default to sum.
    a = _op_counts(_engine(GPT, "fp32", kernel_device, b=4))
    b = _op_counts(_engine(GPT, "fp32", kernel_device, b=4, branch_bias_into_norm=True))
    per_block = 2 * GPT.n_layer
    adds = ("aten::add_", "aten::add")
    assert sum(a[k] for k in adds) - sum(b[k] for k in adds) == per_block, (a, b)  # AccumulateGrad's adds
    # The two projections write n_embd columns; their partial rows' torch sums go where the default takes them.
    assert a["aten::sum"] - b["aten::sum"] == _default_sums(64, [GPT.n_embd] * per_block, kernel_device)


def test_where_branch_bias_into_norm_does_not_apply(kernel_device):
    for cfg, off, why in ((FT, {}, "not applicable: the config has no biases"),
                          (GPT, {"grad_into_buffer": False}, "needs grad_into_buffer and the bias kernel"),
                          (GPT, {"bias_kernel": False}, "needs grad_into_buffer and the bias kernel"),
                          (GPT, {"norm_dw_into_buffer": False}, "needs the fused residual-norm"),
                          (GPT, {"fuse_mlp_act": True}, "fuse_mlp_act computes"),
                          (DROP, {"fuse_dropout": False}, "a dropout module sits between")):
        eng = _engine(cfg, "bf16", kernel_device, branch_bias_into_norm=True, **off)
        assert not eng.describe()["branch_bias_into_norm"] and why in eng.notes["branch_bias_into_norm"], off
        assert not any(getattr(m, "db_elsewhere", False) for m in eng.model.modules())
    assert EngineOptions().branch_bias_into_norm is True  # a default: it won its trial


@pytest.mark.parametrize("prec", ["bf16", "tf32"])
def test_the_default_engine_runs_every_bias_option_that_applies(prec, kernel_device):
    """GPT-2's default engine: the four options on where they apply (the bf16 shadow only under bf16); the
    FastTransformer's: only the first norm (it has no biases)."""
    eng = Engine(GPT, B, T, prec, kernel_device, capture=False).describe()
    assert eng["bias_into_buffer"] and eng["branch_bias_into_norm"] and eng["first_norm_into_buffer"]
    assert eng["bf16_bias_weights"] is (prec == "bf16")
    ft = Engine(FT, B, T, prec, kernel_device, capture=False).describe()
    assert ft["first_norm_into_buffer"]
    assert not (ft["bias_into_buffer"] or ft["bf16_bias_weights"] or ft["branch_bias_into_norm"])
