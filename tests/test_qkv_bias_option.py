"""The engine option ``qkv_bias_into_attention`` (off, on trial): GPT-2's qkv projection bias gradient added into
the flat gradient by the explicit attention's backward kernels (kernels/explicit_attention.py, db_out) instead
of a column-sum kernel per layer. On the default engine it trains like the default, takes the column sum of
d(qkv) away and nothing else, and says where it does not apply."""

from __future__ import annotations

import pytest
import torch

from ftlib.harness.engine_check import pattern_batches
from ftlib.model.config import preset
from ftlib.training.engine import Engine, EngineOptions, grad_into

pytest.importorskip("triton")

B, T = 2, 16
GPT = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=T)
FT = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T)  # no biases

pytestmark = pytest.mark.usefixtures("results_root")  # results under tmp_path (conftest)


def _engine(cfg, prec: str, dev, **options) -> Engine:
    # lr 1e-2: a bias gradient that went nowhere, or twice, moves the next steps' parameters far beyond rounding.
    return Engine(cfg, B, cfg.block_size, prec, dev, seed=4, lr=1e-2, capture=False, **options)


def _steps(eng: Engine, n: int, seed: int = 7) -> list[float]:
    batches = pattern_batches(eng.config.vocab_size, eng.B, eng.T, n, seed=seed, device=eng.device)
    return [float(eng.step(x, y)) for x, y in batches]


@pytest.mark.parametrize("prec", ["tf32", "bf16"])  # strict fp32 keeps cuBLAS's products around the softmax
def test_trains_like_the_default_with_the_qkv_bias_summed_by_the_attention(prec, kernel_device, monkeypatch):
    import kernels.bias_linear as BL

    widths = []
    real = BL.bias_grad_add_
    monkeypatch.setattr(BL, "bias_grad_add_", lambda dy, out, **k: widths.append(out.numel()) or real(dy, out, **k))
    default, on = _engine(GPT, prec, kernel_device), _engine(GPT, prec, kernel_device, qkv_bias_into_attention=True)
    assert on.describe()["qkv_bias_into_attention"] and not default.describe()["qkv_bias_into_attention"]
    assert on.notes["qkv_bias_into_attention"].startswith(f"{GPT.n_layer} qkv projection biases")
    qkv_biases = {id(blk.attn.qkv.bias) for blk in on.model.blocks}
    taken = {id(m.bias) for m in on.model.modules() if isinstance(m, grad_into.GradIntoLinear) and m.db_elsewhere}
    assert qkv_biases <= taken  # with the output projections' (branch_bias_into_norm)
    # Step 1 from the same weights: the same gradients, the qkv biases' summed by other kernels.
    widths.clear()
    _steps(on, 1)
    on_widths = sorted(widths)
    widths.clear()
    _steps(default, 1)
    assert sorted(widths) == sorted(on_widths + [3 * GPT.n_embd] * GPT.n_layer)  # one column sum less per layer
    for name, (off, size) in on.spans.items():
        got, want = on.flat_grad[off:off + size], default.flat_grad[off:off + size]
        # The qkv bias's K slice is zero in exact arithmetic (a key bias shifts whole rows of scores), so only
        # rounding noise to compare: its Q and V slices are compared.
        C = GPT.n_embd
        parts = [(got[:C], want[:C]), (got[2 * C:], want[2 * C:])] if name.endswith("qkv.bias") else [(got, want)]
        for g, w in parts:
            assert w.abs().sum() > 0, name
            assert ((g - w).norm() / w.norm()).item() < 1e-5, name
    # Then three more steps: the losses follow.
    torch.testing.assert_close(torch.tensor(_steps(on, 3)), torch.tensor(_steps(default, 3)), rtol=1e-4, atol=1e-4)


def test_where_it_does_not_apply(kernel_device):
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
    assert EngineOptions().qkv_bias_into_attention is False  # on trial, off until it wins
