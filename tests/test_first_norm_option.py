"""The engine's ``first_norm_into_buffer`` option, on by default: the first block's first norm (no residual add
before it) on the fused residual-norm's backward with its weight (and bias) gradients added into the flat gradient
(kernels/norm_into.py). It trains like the engine without it, removes the sums and adds it says, keeps the
parameters' names, and says where it does not apply."""

from __future__ import annotations

import collections

import pytest
import torch
from gpu_breadth import case
from torch.profiler import ProfilerActivity, profile

from ftlib.harness.engine_check import pattern_batches
from ftlib.model.config import preset
from ftlib.training.engine import Engine, EngineOptions

pytest.importorskip("triton")

B, T = 2, 16  # 32 rows: the default LayerNorm and RMSNorm backwards still leave several partial rows to sum
GPT = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=T)  # LayerNorm with a bias
FT = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T)  # RMSNorm

pytestmark = pytest.mark.usefixtures("results_root")  # results under tmp_path (conftest)


def _engine(cfg, prec: str, dev, **options) -> Engine:
    # lr 1e-2: a gradient off anywhere moves the next steps' parameters far beyond rounding.
    return Engine(cfg, B, T, prec, dev, seed=4, lr=1e-2, capture=False, **options)


def _steps(eng: Engine, n: int, seed: int = 7) -> list[float]:
    return [float(eng.step(x, y)) for x, y in pattern_batches(eng.config.vocab_size, B, T, n, seed=seed,
                                                               device=eng.device)]


# GPT-2's LayerNorm in strict fp32 repeats its bf16 case's paths in the interpreter (tests/gpu_breadth.py).
@pytest.mark.parametrize("cfg,prec", [case(GPT, "fp32", id="gpt2-fp32"), pytest.param(GPT, "bf16", id="gpt2-bf16"),
                                      pytest.param(FT, "tf32", id="fasttransformer-tf32")])
def test_the_first_norm_trains_like_the_engine_without_it(cfg, prec, kernel_device):
    default, on = _engine(cfg, prec, kernel_device, first_norm_into_buffer=False), _engine(cfg, prec, kernel_device)
    assert on.describe()["first_norm_into_buffer"] and not default.describe()["first_norm_into_buffer"]
    assert [n for n, _ in on.model.named_parameters()] == [n for n, _ in default.model.named_parameters()]
    _steps(default, 1), _steps(on, 1)
    for name, (off, size) in on.spans.items():  # the same gradients, the first norm's summed in another order
        got, want = on.flat_grad[off:off + size], default.flat_grad[off:off + size]
        assert want.abs().sum() > 0, name
        assert ((got - want).norm() / want.norm()).item() < 1e-5, name
    torch.testing.assert_close(torch.tensor(_steps(on, 3)), torch.tensor(_steps(default, 3)), rtol=1e-4, atol=1e-4)
    # Outside the step the norm is the ordinary kernel's: the same logits as the default's.
    on.model.eval(), default.model.eval()
    (x, _), = pattern_batches(cfg.vocab_size, B, T, 1, seed=8, device=kernel_device)
    default.flat_param.copy_(on.flat_param)
    with torch.no_grad(), on.prec.base.region(kernel_device):
        torch.testing.assert_close(on.model(x)[0].float(), default.model(x)[0].float(), rtol=1e-5, atol=1e-5)


def _op_counts(eng: Engine) -> collections.Counter:
    _steps(eng, 1, seed=9)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _steps(eng, 1, seed=9)
    return collections.Counter(e.name for e in prof.events())


@pytest.mark.parametrize("cfg,params", [(GPT, 2), (FT, 1)], ids=["gpt2-layernorm", "fasttransformer-rmsnorm"])
def test_the_first_norms_sums_and_adds_go(cfg, params, kernel_device):
    a = _op_counts(_engine(cfg, "fp32", kernel_device, first_norm_into_buffer=False))
    b = _op_counts(_engine(cfg, "fp32", kernel_device))
    adds = ("aten::add_", "aten::add")
    assert sum(a[k] for k in adds) - sum(b[k] for k in adds) == params, (a, b)  # AccumulateGrad, per parameter
    assert a["aten::sum"] - b["aten::sum"] == params  # the partial rows' torch sums


def test_where_it_does_not_apply(kernel_device):
    for off in ({"norm_dw_into_buffer": False}, {"fuse_residual_norm": False}, {"use_kernels": False}):
        eng = _engine(GPT, "fp32", kernel_device, first_norm_into_buffer=True, **off)
        assert not eng.describe()["first_norm_into_buffer"], off
        assert eng.notes["first_norm_into_buffer"].startswith("not applied: needs the fused residual-norm")
    assert EngineOptions().first_norm_into_buffer is True  # a default: it won its trial (chapter 6)
