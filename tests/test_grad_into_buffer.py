"""Engine(grad_into_buffer=True): the Linear layers write their weight gradients into the flat gradient
(``ftlib.training.engine.grad_into``), so autograd adds nothing there for them.

On the CPU (the kernels in Triton's interpreter) the option must give the default engine's gradients
and parameters bit for bit, in fp32 and in bf16 (where the CPU copies the bf16 GEMM into the view,
which is the cast autograd made); on CUDA (``FTLIB_TEST_GPU=1``) bf16 takes the fp32-output GEMM and
the comparison allows bf16 rounding. The tiny models of tests/test_engine.py: 5 Linear weights each
(qkv, proj, fc, proj, head).
"""

from __future__ import annotations

import collections
import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from gpu_breadth import case
from torch.profiler import ProfilerActivity, profile

from ftlib.harness.engine_check import pattern_batches
from ftlib.harness.suites import SUITES
from ftlib.model.config import preset
from ftlib.model.gpt import build_model
from ftlib.training.engine import Engine, EngineOptions, grad_into
from ftlib.training.engine import linears as linears_module
from ftlib.training.engine.flat import flatten_parameters_
from ftlib.training.engine.linears import grad_into_linears
from ftlib.training.engine.options import key_items, option_docs, option_names
from kernels import mm_into

B, T = 1, 16
FT1 = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T)
GPT4 = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=T)
FT_TIED = FT1.replace(tie_weights=True)
N_LINEAR = 5
STEPS = 3
ON, OFF = {"grad_into_buffer": True}, {"grad_into_buffer": False}  # on by default; OFF is the engine without it
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def dev(kernel_device):
    return kernel_device


pytestmark = pytest.mark.usefixtures("results_root")  # results under tmp_path (conftest)


# The bias options and the fused head (bf16) need grad_into_buffer: off on both sides, so that each pair compares
# grad_into_buffer alone, the head included.
BIAS_ALONE = {"bias_into_buffer": False, "bf16_bias_weights": False, "branch_bias_into_norm": False,
              "fc_bias_into_gelu": False, "fuse_head_loss": False}


def _pair(cfg, prec: str, dev, b: int = B, **options) -> tuple[Engine, Engine]:
    # lr 1e-2: a gradient off anywhere changes the next steps' parameters far beyond rounding.
    options = {**BIAS_ALONE, **options}
    return (Engine(cfg, b, T, prec, dev, seed=4, lr=1e-2, **OFF, **options),
            Engine(cfg, b, T, prec, dev, seed=4, lr=1e-2, **ON, **options))


def _train(engines: tuple[Engine, ...], cfg, dev, steps: int = STEPS) -> list[list[float]]:
    losses = [[] for _ in engines]
    for x, y in pattern_batches(cfg.vocab_size, engines[0].B, T, steps, seed=7, device=dev):
        for eng, out in zip(engines, losses):
            out.append(float(eng.step(x, y)))
    return losses


def _same(got: torch.Tensor, want: torch.Tensor, prec: str, dev, what: str) -> None:
    if dev.type == "cpu":
        assert torch.equal(got, want), f"{what}: max diff {(got - want).abs().max().item():.3g}"
    elif prec == "bf16":  # dW no longer rounded to bf16 before it reaches fp32
        torch.testing.assert_close(got, want, atol=2e-2 * want.abs().max().item(), rtol=2e-2, msg=what)
    else:  # cuBLAS may pick another algorithm for the flat buffer's view
        torch.testing.assert_close(got, want, atol=1e-5 * want.abs().max().item(), rtol=1e-4, msg=what)


def _wrapped(eng: Engine) -> list[str]:
    return [n for n, m in eng.model.named_modules() if isinstance(m, grad_into.GradIntoLinear)]


# In the interpreter each model and each precision once (tests/gpu_breadth.py).
@pytest.mark.parametrize("cfg,prec", [case(FT1, "fp32", id="fasttransformer-fp32"),
                                      pytest.param(FT1, "bf16", id="fasttransformer-bf16"),
                                      pytest.param(GPT4, "fp32", id="gpt2-fp32"),
                                      case(GPT4, "bf16", id="gpt2-bf16")])
def test_three_steps_equal_the_default_engine(cfg, prec, dev):
    default, into = _pair(cfg, prec, dev)
    assert len(_wrapped(into)) == N_LINEAR and not _wrapped(default)
    assert into.describe()["grad_into_buffer"] and not default.describe()["grad_into_buffer"]
    assert f"{N_LINEAR} Linear weight" in into.notes["grad_into_buffer"]
    if cfg is GPT4 and dev.type == "cpu":  # composes with the bias kernel: its Triton column sum stays
        assert all(m.bias_grad is not None for m in into.model.modules() if isinstance(m, grad_into.GradIntoLinear)
                   and m.bias is not None)
    if prec == "bf16" and cfg is FT1:  # and with the bf16 weight shadow
        assert into.describe()["bf16_weights"] and all(
            into.model.get_submodule(n).w16 is not None for n in _wrapped(into))
    # Step 1 from the same weights: the same gradients. Then the same losses and parameters.
    la, lb = _train((default, into), cfg, dev, steps=1)
    _same(into.flat_grad, default.flat_grad, prec, dev, "flat_grad after one step")
    assert into.flat_grad[: into.n_decay].abs().sum() > 0  # the weights did get gradients
    la2, lb2 = _train((default, into), cfg, dev, steps=STEPS - 1)
    if dev.type == "cpu":
        assert la + la2 == lb + lb2
        _same(into.flat_param, default.flat_param, prec, dev, "flat_param")
    else:  # an AdamW step moves a weight whose gradient is near zero by up to lr whatever its sign
        assert lb + lb2 == pytest.approx(la + la2, rel=1e-3)
        torch.testing.assert_close(into.flat_param, default.flat_param, atol=2 * STEPS * 1e-2, rtol=0)
    # Outside the step the layers are ordinary Linears on the fp32 weights. On CUDA the two engines'
    # weights legitimately differ by now (checked above, by rounding), and under bf16 autocast the
    # logits are bf16, so a weight that differs by rounding moves a logit by an ulp of bf16, far over
    # an fp32 tolerance. Both models therefore evaluate the same weights (a no-op on the CPU, where
    # they are equal bit for bit), and the logits are compared at the step's precision: what is left
    # to differ is the eval path itself (a stale bf16 shadow would be a whole lr step behind).
    default.flat_param.copy_(into.flat_param)
    (x, _), = pattern_batches(cfg.vocab_size, B, T, 1, seed=8, device=dev)
    default.model.eval()
    into.model.eval()
    with torch.no_grad(), into.prec.base.region(dev):
        _same(into.model(x)[0].float(), default.model(x)[0].float(), prec, dev, "eval logits")


def _backward_op_counts(eng: Engine, cfg, dev) -> collections.Counter:
    (x, y), = pattern_batches(cfg.vocab_size, B, T, 1, seed=9, device=dev)
    eng.step(x, y)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        eng.step(x, y)
    return collections.Counter(e.name for e in prof.events())


@pytest.mark.parametrize("prec", ["fp32", "bf16"])
@pytest.mark.parametrize("cfg", [FT1, GPT4, FT_TIED], ids=["fasttransformer", "gpt2", "fasttransformer-tied"])
def test_one_add_fewer_per_linear_weight(cfg, prec, dev):
    """AccumulateGrad's add into the flat view goes for each Linear weight, and under bf16 the cast
    of its bf16 gradient to fp32 too (aten::_to_copy; on the CPU the copy into the view remains)."""
    default, into = _pair(cfg, prec, dev, capture=False)  # the ops themselves, not a graph's replay
    a, b = _backward_op_counts(default, cfg, dev), _backward_op_counts(into, cfg, dev)
    adds = ("aten::add_", "aten::add")  # the tied weight's two contributions meet in an out-of-place add
    assert sum(a[k] for k in adds) - sum(b[k] for k in adds) == N_LINEAR, (a, b)
    assert a["aten::_to_copy"] - b["aten::_to_copy"] == (N_LINEAR if prec == "bf16" else 0)
    assert a["aten::mm"] + a["aten::addmm"] == b["aten::mm"] + b["aten::addmm"]  # no GEMM added


def test_the_fp32_output_gemm_where_the_device_has_it(dev, monkeypatch):
    """Under bf16 the engine asks for ``torch.mm(..., out_dtype=torch.float32, out=view)`` where the
    device runs it. On the CPU, where that overload has no kernel, a stand-in computes the same
    product (bf16 operands, fp32 accumulation and output) so the engine's use of it is checked here."""
    calls = []

    def fp32_out_mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
        assert a.dtype == b.dtype == torch.bfloat16 and out.dtype == torch.float32
        calls.append(out.data_ptr())
        torch.mm(a.float(), b.float(), out=out)

    if dev.type == "cpu":
        assert not mm_into.fp32_out_mm_available(dev)
        monkeypatch.setattr(mm_into, "_mm_fp32_out", fp32_out_mm)
        monkeypatch.setattr(linears_module, "fp32_out_mm_available", lambda device: True)
    default, into = _pair(FT1, "bf16", dev)
    assert "fp32 output" in into.notes["grad_into_buffer"]
    _train((default, into), FT1, dev, steps=1)
    if dev.type == "cpu":
        weights = {into.model.get_submodule(n).grad.data_ptr() for n in _wrapped(into)}
        assert len(calls) == N_LINEAR and set(calls) == weights
    # The weight gradients against the default's bf16-rounded ones: equal up to that rounding.
    g, want = into.flat_grad[: into.n_decay], default.flat_grad[: default.n_decay]
    torch.testing.assert_close(g, want, atol=1e-2 * want.abs().max().item(), rtol=1e-2)
    assert not torch.equal(g, want)  # and not bit for bit: the rounding to bf16 is gone
    la, lb = _train((default, into), FT1, dev, steps=STEPS - 1)
    assert lb == pytest.approx(la, rel=1e-3)


def test_without_the_fp32_output_gemm_the_bf16_gemm_is_copied_in(monkeypatch):
    """The probe says no where the overload has no kernel (the CPU) or no keyword (a torch before it):
    then the engine copies the bf16 GEMM into the view, and says so."""
    mm_into.fp32_out_mm_available.cache_clear()
    assert not mm_into.fp32_out_mm_available(torch.device("cpu"))
    assert "copied in" in Engine(FT1, B, T, "bf16", "cpu", use_kernels=False, **ON).notes["grad_into_buffer"]

    def old_torch(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
        raise TypeError("mm() got an unexpected keyword argument 'out_dtype'")

    monkeypatch.setattr(mm_into, "_mm_fp32_out", old_torch)
    mm_into.fp32_out_mm_available.cache_clear()
    try:
        assert not mm_into.fp32_out_mm_available(torch.device("meta"))
    finally:
        mm_into.fp32_out_mm_available.cache_clear()


@pytest.mark.parametrize("prec", ["fp32", "bf16"])
def test_tied_head_writes_and_the_embedding_adds(prec, dev):
    """The tied head (``head.weight is wte.weight``) writes its GEMM into the shared view; the embedding's
    gradient is then added by AccumulateGrad. Both contributions must be there, as in the default: had
    the head written after the embedding's add, or not at all, the tied weight's gradient would differ."""
    # fuse_embedding off on both sides: its kernel adds the embedding's part into the view itself, before
    # AccumulateGrad adds the head's (off) or after the head wrote it (on), another order of the same sums.
    # Two sequences: on the GPU under bf16 the into-buffer side keeps dW unrounded, and one sequence's tokens touch few
    # of the tied weight's rows, so that difference, grown over the steps at lr 1e-2, left the comparison's tolerance
    # at one sequence (it held at two).
    default, into = _pair(FT_TIED, prec, dev, b=2, fuse_embedding=False)
    assert into.model.head.weight is into.model.wte.weight
    assert "head" in _wrapped(into) and "left on autograd" not in into.notes["grad_into_buffer"]
    _train((default, into), FT_TIED, dev)
    off, n = into.spans["wte.weight"]
    _same(into.flat_grad[off : off + n], default.flat_grad[off : off + n], prec, dev, "tied weight's gradient")
    _same(into.flat_param, default.flat_param, prec, dev, "flat_param")


def test_a_weight_shared_by_two_linears_stays_on_autograd(dev):
    """Two Linears writing one view would leave only the second's GEMM there: such a weight is left to
    AccumulateGrad (and said so), and the gradients equal autograd's."""
    cfg = FT1.replace(n_layer=2)
    model = build_model(cfg, seed=1).to(dev)
    model.blocks[1].attn.proj.weight = model.blocks[0].attn.proj.weight  # (C, C), shared
    ref = copy.deepcopy(model)
    named = list(model.named_parameters())
    _, flat_grad, spans = flatten_parameters_([p for _, p in named])
    n, left = grad_into_linears(model, flat_grad, {name: s for (name, _), s in zip(named, spans)}, False)
    assert n == 4 * 2 + 1 - 2 and set(left) == {"blocks.0.attn.proj", "blocks.1.attn.proj"}
    assert "shared" in left["blocks.0.attn.proj"]
    (x, y), = pattern_batches(cfg.vocab_size, B, T, 1, seed=2, device=dev)
    model(x, y)[1].backward()
    ref(x, y)[1].backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        _same(p.grad, q.grad, "fp32", dev, name)


def test_linear_layers_on_the_triton_gemm_are_left_alone(dev):
    eng = Engine(FT1, B, T, "fp32", dev, linear_precision="ieee", **ON)
    assert not _wrapped(eng) and not eng.describe()["grad_into_buffer"]
    assert eng.notes["grad_into_buffer"].startswith("not applied")


def test_the_layer_checks_its_gradient_view():
    lin = nn.Linear(8, 4)
    with pytest.raises(ValueError, match="fp32 of shape"):
        grad_into.GradIntoLinear(lin, torch.zeros(8, 4))
    with pytest.raises(ValueError, match="fp32 of shape"):
        grad_into.GradIntoLinear(lin, torch.zeros(4, 8, dtype=torch.bfloat16))


def test_option_is_validated_documented_and_keyed_only_when_set():
    assert EngineOptions().grad_into_buffer is True  # a default since it won its trial (engine_candidates)
    assert "grad_into_buffer" in option_names(recipe=True) and "flat gradient" in option_docs()["grad_into_buffer"]
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match=r"grad_into_buffer=.* must be True or False"):
            EngineOptions(grad_into_buffer=bad)
        with pytest.raises(ValueError, match="grad_into_buffer"):
            Engine(FT1, B, T, "fp32", "cpu", grad_into_buffer=bad)
    assert key_items([("grad_into_buffer", True)]) == (("grad_into_buffer", True),)
    # A recipe that pins it off keeps the key of the runs stored before it was a default (they ran without it).
    assert key_items([("grad_into_buffer", False)]) == ()
    # The engine suite (its keys are the stored snapshot's) switches it off in its own cases, beside the
    # default cases of the same model and precision; it is no longer on trial in engine_candidates.
    snapshot = json.loads((ROOT / "tests" / "fixtures" / "catalogue_keys.json").read_text())
    cases = SUITES["engine"].cases()
    assert [c.key("engine") for c in cases] == snapshot["step_suites"]["engine"]
    off = [c for c in cases if c.extra.get("grad_into_buffer") is False]
    defaults = {(c.config.config_hash(), c.precision) for c in cases if c.label in ("fasttransformer", "gpt2")}
    assert {(c.config.config_hash(), c.precision) for c in off} <= defaults
    assert {c.precision for c in off} == {"bf16", "tf32"} and len(off) == 4
    assert all(c.label.endswith(" -grad-into-buffer") for c in off)
    assert len({c.key("engine") for c in cases}) == len(cases)
    assert not any("grad_into_buffer" in c.extra for c in SUITES["engine_candidates"].cases())


def test_the_layer_checks_its_bias_views():
    lin = nn.Linear(8, 4)
    grad = torch.zeros(4, 8)
    with pytest.raises(ValueError, match="db_out must be fp32 of shape \\(4,\\)"):
        grad_into.GradIntoLinear(lin, grad, db_out=torch.zeros(8))
    with pytest.raises(ValueError, match="b16 must be bf16 of shape \\(4,\\)"):
        grad_into.GradIntoLinear(lin, grad, b16=torch.zeros(4))
    with pytest.raises(ValueError, match="for a Linear with a bias"):
        grad_into.GradIntoLinear(nn.Linear(8, 4, bias=False), grad, db_out=torch.zeros(4))
