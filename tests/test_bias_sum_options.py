"""Two engine options that sum one of GPT-2's bias gradients inside a kernel that already holds its dy, instead
of a column-sum kernel per layer reading dy back: ``qkv_bias_into_attention`` (the qkv projection's, in the
explicit attention's backward kernels: kernels/explicit_attention.py, db_out; off, it lost its trial) and
``fc_bias_into_gelu`` (the MLP up-projection's, in GELU's backward: kernels/bias_linear.py, gelu_bwd_bias_add_;
a default, it won its trial). Each, on, trains like the engine with it off, takes that column sum away and
nothing else, and says where it does not apply."""

from __future__ import annotations

import pytest
import torch
from gpu_breadth import case

from ftlib.harness.engine_check import pattern_batches
from ftlib.model.config import preset
from ftlib.training.engine import Engine, EngineOptions, grad_into

pytest.importorskip("triton")

B, T = 1, 16
GPT = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=T)
FT = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T)  # no biases

pytestmark = pytest.mark.usefixtures("results_root")  # results under tmp_path (conftest)


def _engine(cfg, prec: str, dev, **options) -> Engine:
    # lr 1e-2: a bias gradient that went nowhere, or twice, moves the next steps' parameters far beyond rounding.
    return Engine(cfg, B, cfg.block_size, prec, dev, seed=4, lr=1e-2, capture=False, **options)


def _steps(eng: Engine, n: int, seed: int = 7) -> list[float]:
    batches = pattern_batches(eng.config.vocab_size, eng.B, eng.T, n, seed=seed, device=eng.device)
    return [float(eng.step(x, y)) for x, y in batches]


# (option, the width of the column sum it takes away, the bias's tail whose gradient goes to that option's kernel)
OPTIONS = [("qkv_bias_into_attention", 3 * GPT.n_embd, "attn.qkv.bias"), ("fc_bias_into_gelu", GPT.d_ff, "mlp.fc.bias")]


# Each in tf32 and bf16; GELU's, a default, also in strict fp32 and fp16 (the attention's needs the explicit-attention
# kernels, which strict fp32 leaves to cuBLAS's products around the softmax). In the interpreter GELU's tf32 and fp16
# cases repeat the attention's tf32 and GELU's bf16 paths (tests/gpu_breadth.py).
CASES = [(*o, prec) for o in OPTIONS for prec in ("tf32", "bf16")] + [(*OPTIONS[1], prec) for prec in ("fp32", "fp16")]
COMPILED_ONLY = {("fc_bias_into_gelu", "tf32"), ("fc_bias_into_gelu", "fp16")}


@pytest.mark.parametrize("option,width,bias,prec", [
    case(*c, id=f"{c[0]}-{c[3]}") if (c[0], c[3]) in COMPILED_ONLY else pytest.param(*c, id=f"{c[0]}-{c[3]}")
    for c in CASES])
def test_each_trains_like_the_engine_without_it_with_one_column_sum_less_per_layer(prec, option, width, bias,
                                                                                   kernel_device, monkeypatch):
    import kernels.bias_linear as BL

    widths = []  # the column sums added into the flat gradient, by width
    real = BL.bias_grad_add_
    monkeypatch.setattr(BL, "bias_grad_add_", lambda dy, out, **k: widths.append(out.numel()) or real(dy, out, **k))
    off, on = _engine(GPT, prec, kernel_device, **{option: False}), _engine(GPT, prec, kernel_device, **{option: True})
    assert on.describe()[option] and not off.describe()[option]
    assert on.notes[option].startswith(f"{GPT.n_layer} ")
    mine = {id(p) for n, p in on.model.named_parameters() if n.endswith(bias)}
    taken = {id(m.bias) for m in on.model.modules() if isinstance(m, grad_into.GradIntoLinear) and m.db_elsewhere}
    assert len(mine) == GPT.n_layer and mine <= taken  # with the output projections' (branch_bias_into_norm)
    # Step 1 from the same weights: the same gradients, those biases' summed by the option's kernels.
    _steps(on, 1)
    on_widths = sorted(widths)
    widths.clear()
    _steps(off, 1)
    assert sorted(widths) == sorted(on_widths + [width] * GPT.n_layer)
    C = GPT.n_embd
    for name, (start, size) in on.spans.items():
        got, want = on.flat_grad[start:start + size], off.flat_grad[start:start + size]
        # The qkv bias's K slice is zero in exact arithmetic (a key bias shifts whole rows of scores), so only
        # rounding noise to compare: its Q and V slices are compared.
        parts = [(got[:C], want[:C]), (got[2 * C:], want[2 * C:])] if name.endswith("qkv.bias") else [(got, want)]
        # bf16, fp16: GELU's backward on the column-sum kernel may round dz one step from torch's kernel.
        tol = 1e-2 if prec in ("bf16", "fp16") and option == "fc_bias_into_gelu" else 1e-5
        for g, w in parts:
            assert w.abs().sum() > 0, name
            assert ((g - w).norm() / w.norm()).item() < tol, name
    # Then three more steps: the losses follow.
    torch.testing.assert_close(torch.tensor(_steps(on, 3)), torch.tensor(_steps(off, 3)), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("option,bias", [(o, b) for o, _, b in OPTIONS], ids=[o for o, _, _ in OPTIONS])
def test_each_needs_the_bias_gradient_buffer_to_add_into(option, bias, kernel_device):
    eng = _engine(GPT, "tf32", kernel_device, **{option: True})
    (param,) = [p for n, p in eng.model.named_parameters() if n.endswith(bias)]
    param.grad = None  # not the flat gradient's view any more
    (x, y), = pattern_batches(GPT.vocab_size, B, T, 1, device=kernel_device)
    with pytest.raises(RuntimeError, match=r"needs each parameter's \.grad to be its gradient buffer"):
        eng.model(x, y)


def test_gelu_bias_mlp_evaluates_with_the_mlps_own_forward(kernel_device):
    eng = _engine(GPT, "tf32", kernel_device, fc_bias_into_gelu=True)
    assert all(type(blk.mlp).__name__ == "GeluBiasMLP" for blk in eng.model.blocks)
    eng.model.eval()  # no gradient buffer is needed there
    with torch.no_grad():
        assert eng.model(torch.zeros(1, T, dtype=torch.long, device=kernel_device))[0].isfinite().all()


def test_where_fc_bias_into_gelu_does_not_apply(kernel_device):
    for cfg, off, why in ((FT, {}, "not applicable: the config has no biases"),
                          (GPT.replace(activation="relu2"), {}, "not applicable: the MLP's activation is 'relu2'"),
                          (GPT, {"fuse_mlp_act": True}, "fuse_mlp_act sums"),
                          (GPT, {"grad_into_buffer": False}, "needs grad_into_buffer and the bias kernel"),
                          (GPT, {"bias_kernel": False}, "needs grad_into_buffer and the bias kernel")):
        eng = _engine(cfg, "tf32", kernel_device, fc_bias_into_gelu=True, **off)
        assert not eng.describe()["fc_bias_into_gelu"], off
        assert why in eng.notes["fc_bias_into_gelu"], (off, eng.notes["fc_bias_into_gelu"])
    assert EngineOptions().fc_bias_into_gelu is True  # it won its trial: a default


def test_where_qkv_bias_into_attention_does_not_apply(kernel_device):
    for cfg, off, why in ((FT, {}, "not applicable: the explicit attention kernels"),
                          (GPT, {"precision": "fp32"}, "not applicable: the explicit attention kernels"),
                          (GPT, {"fuse_softmax_matmuls": False}, "not applicable: the explicit attention kernels"),
                          (GPT.replace(bias=False), {}, "not applicable: the qkv projection has no bias"),
                          (GPT, {"grad_into_buffer": False}, "needs grad_into_buffer and the bias kernel"),
                          (GPT, {"bias_kernel": False}, "needs grad_into_buffer and the bias kernel")):
        off = dict(off)
        eng = _engine(cfg, off.pop("precision", "tf32"), kernel_device, qkv_bias_into_attention=True, **off)
        assert not eng.describe()["qkv_bias_into_attention"], off
        assert why in eng.notes["qkv_bias_into_attention"], (off, eng.notes["qkv_bias_into_attention"])
    assert EngineOptions().qkv_bias_into_attention is False  # it lost its trial: an option, off
