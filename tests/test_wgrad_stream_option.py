"""Engine(wgrad_side_stream=True), a default under bf16/fp16: each Linear's weight-gradient GEMM queued on a
second CUDA stream and joined after the backward (``ftlib.training.engine.wgrad_stream``).

On the CPU there are no streams, so the wiring is tested with a stand-in stream that holds the queued work
back until it is joined, as a side stream that has not run yet would: if any gradient were read before the
join, or the join never came, the parameters would leave the default engine's. On CUDA
(``FTLIB_TEST_GPU=1``) the real stream runs inside the captured step and must give the default engine's
losses and parameters.
"""

from __future__ import annotations

import pytest
import torch
from gpu_breadth import case

from ftlib.harness.engine_check import pattern_batches
from ftlib.harness.suites import CANDIDATES, SUITES
from ftlib.model.config import preset
from ftlib.training.engine import Engine, EngineOptions
from ftlib.training.engine import linears as linears_module
from ftlib.training.engine.grad_into import GradIntoLinear
from ftlib.training.engine.wgrad_stream import WGradStream, wgrad_stream_for

B, T, STEPS = 2, 16, 3
FT1 = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T)
GPT4 = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=T)
ON, OFF = {"wgrad_side_stream": True}, {"wgrad_side_stream": False}

pytestmark = pytest.mark.usefixtures("results_root")


class HeldStream:
    """A stand-in for :class:`WGradStream` that runs nothing until :meth:`join`."""

    def __init__(self) -> None:
        self.queued: list = []
        self.kept: list[list[tuple[int, ...]]] = []
        self.runs = self.joins = 0

    def run(self, work, *keep: torch.Tensor) -> None:
        self.queued.append(work)
        self.kept.append([tuple(t.shape) for t in keep])
        self.runs += 1

    def join(self) -> None:
        # As the backward that queued the work would have run it: no autograd, no autocast.
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            for work in self.queued:
                work()
        self.queued.clear()
        self.joins += 1


def _held_engine(monkeypatch, cfg, prec: str, **options) -> tuple[Engine, HeldStream]:
    held = HeldStream()
    monkeypatch.setattr(linears_module, "wgrad_stream_for",
                        lambda device, asked, grad_into, low: (held, "held") if asked and grad_into else (None, None))
    return Engine(cfg, B, T, prec, "cpu", seed=4, lr=1e-2, **ON, **options), held


def _train(engines, cfg, dev, steps: int = STEPS) -> list[list[float]]:
    losses = [[] for _ in engines]
    for x, y in pattern_batches(cfg.vocab_size, B, T, steps, seed=7, device=dev):
        for eng, out in zip(engines, losses):
            out.append(float(eng.step(x, y)))
    return losses


@pytest.mark.parametrize("cfg", [FT1, GPT4], ids=["fasttransformer", "gpt2"])
@pytest.mark.parametrize("prec", ["fp32", "bf16"])
def test_held_weight_gradients_joined_before_the_update_give_the_default_engine(monkeypatch, cfg, prec):
    ref = Engine(cfg, B, T, prec, "cpu", seed=4, lr=1e-2, use_kernels=False, **OFF)
    eng, held = _held_engine(monkeypatch, cfg, prec, use_kernels=False)
    assert eng.notes["wgrad_side_stream"] == "held" and eng.describe()["wgrad_side_stream"] is True
    losses = _train((ref, eng), cfg, torch.device("cpu"))
    assert losses[0] == losses[1]
    assert torch.equal(eng.flat_param, ref.flat_param)  # every update saw every weight gradient
    n_linear = sum(isinstance(m, GradIntoLinear) for m in eng.model.modules())
    assert n_linear == 5 and held.runs == STEPS * n_linear and held.joins == STEPS and not held.queued
    # Each GEMM kept its two operands alive: dy (M, N) and x (M, K), M = B * T.
    assert all(len(k) == 2 and k[0][0] == k[1][0] == B * T for k in held.kept)


def test_gpt2s_bias_added_into_the_flat_gradient_goes_on_the_stream_too(monkeypatch):
    """With the kernels (bias kernel, bias_into_buffer), the qkv bias's column sum is added into the flat
    gradient by the Linear's backward: held with the weight gradient, it must still reach the update."""
    ref = Engine(GPT4, B, T, "fp32", "cpu", seed=4, lr=1e-2, **OFF)
    eng, held = _held_engine(monkeypatch, GPT4, "fp32")
    qkv = eng.model.blocks[0].attn.qkv
    assert isinstance(qkv, GradIntoLinear) and qkv.db_out is not None  # the case this test is about
    before_join = []
    join = held.join

    def checked_join():  # the bias's view still empty at the join: its add was held, not run inline
        before_join.append(bool(qkv.db_out.abs().sum() == 0) and bool(qkv.grad.abs().sum() == 0))
        join()

    eng.optimizer.join_backward = checked_join
    _train((ref, eng), GPT4, torch.device("cpu"), steps=2)
    torch.testing.assert_close(eng.flat_param, ref.flat_param, rtol=1e-6, atol=1e-7)  # atomic adds: any order
    assert held.joins == 2 and before_join == [True, True]


def test_without_the_join_the_update_misses_the_weight_gradients(monkeypatch):
    """The test above can fail: with the join taken out the held GEMMs run too late."""
    ref = Engine(FT1, B, T, "fp32", "cpu", seed=4, lr=1e-2, use_kernels=False, **OFF)
    eng, held = _held_engine(monkeypatch, FT1, "fp32", use_kernels=False)
    eng.optimizer.join_backward = None
    _train((ref, eng), FT1, torch.device("cpu"), steps=1)
    assert held.queued and not torch.equal(eng.flat_param, ref.flat_param)


def test_the_tied_head_stays_on_the_main_stream(monkeypatch):
    eng, _ = _held_engine(monkeypatch, FT1.replace(tie_weights=True), "fp32", use_kernels=False)
    lins = {n: m for n, m in eng.model.named_modules() if isinstance(m, GradIntoLinear)}
    assert lins["head"].wgrad_stream is None
    assert all(m.wgrad_stream is not None for n, m in lins.items() if n != "head") and len(lins) == 5


def test_where_it_does_not_apply_it_says_why():
    assert wgrad_stream_for(torch.device("cpu"), False, True, True) == (None, None)
    assert wgrad_stream_for(torch.device("cpu"), True, False, True)[1] == "not applied: needs grad_into_buffer"
    assert "bf16 and fp16 only" in wgrad_stream_for(torch.device("cpu"), True, True, False)[1]
    assert "CUDA" in wgrad_stream_for(torch.device("cpu"), True, True, True)[1]
    assert "bf16 and fp16 only" in Engine(FT1, B, T, "tf32", "cpu", use_kernels=False).notes["wgrad_side_stream"]
    eng = Engine(FT1, B, T, "fp32", "cpu", use_kernels=False, grad_into_buffer=False, **ON)
    assert eng.notes["wgrad_side_stream"] == "not applied: needs grad_into_buffer"
    assert eng.describe()["wgrad_side_stream"] is False and eng.optimizer.join_backward is None
    with pytest.raises(ValueError, match="needs a CUDA device"):
        WGradStream(torch.device("cpu"))
    with pytest.raises(ValueError, match="wgrad_side_stream"):
        EngineOptions(wgrad_side_stream="yes")


def test_it_won_its_trial_and_is_a_default_with_its_ablation_in_the_engine_suite():
    assert EngineOptions().wgrad_side_stream is True and not [c for c in CANDIDATES if c[1] == ON]
    ablations = [c for c in SUITES["engine"].cases() if c.extra == OFF]
    assert {(c.label, c.precision) for c in ablations} == {("fasttransformer -wgrad-stream", "bf16"),
                                                           ("gpt2 -wgrad-stream", "bf16")}


# In the interpreter the fallback is the same for every case: each model and each precision once (tests/gpu_breadth.py).
@pytest.mark.parametrize("prec,cfg", [pytest.param("tf32", FT1, id="tf32-fasttransformer"),
                                      case("tf32", GPT4, id="tf32-gpt2"),
                                      case("bf16", FT1, id="bf16-fasttransformer"),
                                      pytest.param("bf16", GPT4, id="bf16-gpt2")])
def test_on_cuda_the_captured_step_with_the_side_stream_gives_the_default_engine(kernel_device, cfg, prec):
    """CPU mode: the option falls back, with its note, and changes nothing. GPU mode: the real stream under
    bf16; under tf32 it does not apply."""
    ref = Engine(cfg, B, T, prec, kernel_device, seed=4, lr=1e-2, **OFF)
    eng = Engine(cfg, B, T, prec, kernel_device, seed=4, lr=1e-2, **ON)
    on_cuda = kernel_device.type == "cuda"
    assert eng.describe()["wgrad_side_stream"] is (on_cuda and prec == "bf16") and eng.captured is on_cuda
    losses = _train((ref, eng), cfg, kernel_device, steps=5)
    # The same GEMMs on another stream: cuBLAS may pick another algorithm there, so allow its rounding.
    torch.testing.assert_close(torch.tensor(losses[1]), torch.tensor(losses[0]), rtol=1e-4, atol=1e-5)
    scale = ref.flat_param.abs().max().item()
    torch.testing.assert_close(eng.flat_param, ref.flat_param, rtol=1e-4, atol=1e-5 * scale)
