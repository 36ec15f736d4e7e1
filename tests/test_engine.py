"""Tests of ftlib.training.engine: flat buffers, kernel swaps, and losses against reference training.

The tests that run kernels take ``kernel_device`` (tests/conftest.py): Triton's CPU interpreter
by default, so the shapes are tiny (B=1, T=16, one or two layers) and the runs short; with
FTLIB_TEST_GPU=1 the same tests run compiled on CUDA, where the engine captures its step in a
CUDA graph (``captured``). The GPU runner checks 100 steps at B=32, T=256 with
``check_against_reference`` (ci/gpu_bench.py, suite engine_check). References train on the
same device as the engine.
"""

from __future__ import annotations

import re

import pytest
import torch

from ftlib.harness.bench.step import bench_step
from ftlib.harness.engine_check import check_against_reference, pattern_batches
from ftlib.model.config import preset
from ftlib.model.gpt import build_model
from ftlib.training.engine import KERNEL_OPS, Engine, EngineOptions

B, T = 1, 16
# hs = 64 / 4 = 16: the smallest head size the attention kernel takes.
FT1 = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T)
FT4 = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=T)
GPT4 = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=T)
# Two layers, n_embd=32: hs = 8, which the attention kernel does not take (it falls back).
FT1_L2_HS8 = preset("fasttransformer", n_layer=2, n_embd=32, n_head=4, n_kv_head=1, block_size=T)
GPT1_L2 = preset("gpt2", n_layer=2, n_embd=32, n_head=4, n_kv_head=1, block_size=T)
STEPS = 4  # against reference; the GPU check runs 100
# fp32 on the CPU: the kernels change only the order of float sums (measured ~2e-7 over 10 steps).
LOSS_RTOL = 1e-5
PARAM_RTOL = 1e-5


@pytest.fixture()
def dev(kernel_device):
    """The engine's device: a test that asks for it runs kernels (marked ``kernels``)."""
    return kernel_device


pytestmark = pytest.mark.usefixtures("results_root")  # results under tmp_path (conftest)


def test_parameters_and_grads_are_views_into_the_flat_buffers(dev):
    for cfg in (FT1, GPT1_L2):
        eng = Engine(cfg, B, T, "fp32", dev)
        fp, fg, esz = eng.flat_param, eng.flat_grad, eng.flat_param.element_size()
        params = dict(eng.model.named_parameters())
        assert set(eng.spans) == set(params) and eng.num_params() == sum(p.numel() for p in params.values())
        end = 0
        for name, (off, n) in sorted(eng.spans.items(), key=lambda kv: kv[1][0]):
            p = params[name]
            assert off == end, "segments are packed back to back"
            assert p.is_contiguous() and p.numel() == n
            assert p.data_ptr() == fp.data_ptr() + off * esz, name
            assert p.grad is not None and p.grad.data_ptr() == fg.data_ptr() + off * esz, name
            # Decayed matrices first: the flat AdamW kernel decays elements [0, n_decay).
            assert (off + n <= eng.n_decay) if p.dim() >= 2 else (off >= eng.n_decay), name
            end = off + n
        assert end == fp.numel() == fg.numel()
        assert eng.n_decay == sum(p.numel() for p in params.values() if p.dim() >= 2)


def test_kernels_swapped_where_they_apply(dev):
    ft = Engine(FT1, B, T, "tf32", dev)
    assert ft.kernels == {"rmsnorm": True, "layernorm": False, "attention": True, "embedding": True,
                          "cross_entropy": True, "adamw": True}
    assert type(ft.model.wte).__name__ == type(ft.model.wpe).__name__ == "ScatterEmbedding"
    assert type(ft.model.norm_f).__name__ == "TritonRMSNorm"
    assert ft.model.blocks[0].attn.core.input_precision == "tf32"  # tf32 precision -> tf32 dots
    assert ft.optimizer.torch_adamw is None and ft.optimizer.name == "flat-adamw-triton"
    gpt = Engine(GPT4, B, T, "fp32", dev)
    assert [op for op in KERNEL_OPS if gpt.kernels[op]] == ["layernorm", "embedding", "cross_entropy", "adamw"]
    assert "explicit" in gpt.notes["attention"]  # GPT-2's materialized softmax stays by default
    # The first norm on the fused residual-norm's backward (first_norm_into_buffer), else the LayerNorm kernel.
    assert type(gpt.model.blocks[0].norm1).__name__ == "FirstNormInto"
    own = Engine(GPT4, B, T, "fp32", dev, first_norm_into_buffer=False)
    assert type(own.model.blocks[0].norm1).__name__ == "TritonLayerNorm"
    flash = Engine(GPT4, B, T, "fp32", dev, attention_for_explicit=True)
    assert flash.kernels["attention"] and flash.model.blocks[0].attn.core.input_precision == "ieee"
    strict = Engine(FT1, B, T, "fp32", dev)  # strict fp32: SDPA's kernel won in a graph, so it stays
    assert not strict.kernels["attention"] and "strict fp32" in strict.notes["attention"]
    x3 = Engine(FT1, B, T, "fp32", dev, attention_precision="tf32x3", linear_precision="tf32x3")
    assert x3.model.blocks[0].attn.core.input_precision == "tf32x3"
    assert type(x3.model.head).__name__ == "TritonLinear" and x3.describe()["linear_precision"] == "tf32x3"
    with pytest.raises(ValueError, match="linear_precision"):
        Engine(FT1, B, T, "fp32", dev, linear_precision="fp8")
    # The residual add is fused into the next norm by default, LayerNorm too; not without the norm kernel.
    assert ft.fuse_residual_norm and gpt.fuse_residual_norm and "layernorm" in gpt.notes["residual_norm"]
    assert not Engine(GPT4, B, T, "fp32", dev, use_kernels={"layernorm": False}).fuse_residual_norm
    assert not Engine(FT1, B, T, "fp32", dev, fuse_residual_norm=False).fuse_residual_norm
    assert ft.options.attention_layout == "packed" and ft.describe()["attention_layout"] == "packed"
    with pytest.raises(ValueError, match="attention_layout"):
        Engine(FT1, B, T, "fp32", dev, attention_layout="bthd")
    hs8 = Engine(FT1_L2_HS8, B, T, "fp32", dev)
    assert not hs8.kernels["attention"] and "head size 8" in hs8.notes["attention"]
    off = Engine(FT1, B, T, "fp32", dev, use_kernels={"attention": False, "adamw": False})
    assert not off.kernels["attention"] and off.kernels["rmsnorm"] and off.kernels["cross_entropy"]
    torch_adamw = "adamw-fused-capturable" if dev.type == "cuda" else "adamw-default"
    assert off.optimizer.name == torch_adamw and "switched off" in off.notes["adamw"]
    # The swaps keep parameter names and order: the reference's optimizer groups line up.
    assert [n for n, _ in ft.model.named_parameters()] == [n for n, _ in build_model(FT1).named_parameters()]


def test_gradients_land_in_the_flat_buffer_and_match_reference(dev):
    for cfg in (FT1, GPT4):
        (x, y), = pattern_batches(cfg.vocab_size, B, T, 1, seed=3, device=dev)
        eng = Engine(cfg, B, T, "fp32", dev, seed=5)
        eng.step(x, y)  # the step leaves its gradients in flat_grad (zeroed at the next step's start)
        ref = build_model(cfg, seed=5).to(dev)
        ref(x, y)[1].backward()
        for name, p in ref.named_parameters():
            off, n = eng.spans[name]
            g = eng.flat_grad[off : off + n].view_as(p)
            torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
        assert eng.flat_grad.abs().sum() > 0


@pytest.mark.parametrize("cfg", [FT1, FT4, GPT4, GPT1_L2], ids=["ft-mqa", "ft-mha", "gpt2-mha", "gpt2-mqa-2layer"])
def test_losses_match_reference_training(cfg, dev):
    # attention_precision='ieee' puts the attention kernel in the fp32 step (the default keeps SDPA)
    r = check_against_reference(cfg, steps=STEPS, device=dev, B=B, T=T, attention_precision="ieee")
    assert r["ok"] and r["max_rel_err"] <= LOSS_RTOL, r["max_rel_err"]
    assert r["param_rel_err"] <= PARAM_RTOL, r["param_rel_err"]
    assert len(r["losses_engine"]) == STEPS and r["captured"] is (dev.type == "cuda")


@pytest.mark.parametrize("cfg,options", [
    (FT1, {"attention_layout": "heads", "attention_precision": "ieee"}),
    (FT1, {"attention_precision": "tf32x3", "linear_precision": "tf32x3"}),
    (FT1, {"fuse_residual_norm": False}),
    (GPT4, {"attention_for_explicit": True, "attention_layout": "packed", "fuse_residual_norm": True}),
    (GPT4, {"attention_for_explicit": True, "bias_kernel": True}),
    (GPT4, {"fused_softmax": False}),
    (GPT1_L2, {"fused_softmax": True, "bias_kernel": True}),
    (FT1, {"norm_dw_partials": "persistent", "attention_precision": "ieee"}),
    (GPT4, {"norm_dw_partials": "persistent"}),
    (FT1, {"norm_dw_into_buffer": True, "attention_precision": "ieee"}),
    (GPT4, {"norm_dw_into_buffer": True}),
], ids=["heads-layout", "3xtf32", "unfused-residual-norm", "gpt2-packed-fused-layernorm", "gpt2-bias-kernel",
        "gpt2-unfused-softmax", "gpt2-mqa-fused-softmax", "persistent-norm-dw", "gpt2-persistent-norm-dw",
        "norm-dw-into-buffer", "gpt2-norm-dw-into-buffer"])
def test_engine_options_train_like_the_reference(cfg, options, dev):
    r = check_against_reference(cfg, steps=3, device=dev, B=B, T=T, **options)
    assert r["ok"] and r["max_rel_err"] <= LOSS_RTOL and r["param_rel_err"] <= PARAM_RTOL
    for k, v in options.items():
        assert r[k] == v if k != "attention_for_explicit" else "attention" in r["kernels"]


@pytest.mark.parametrize("cfg,op", [(FT1, "rmsnorm"), (FT1, "attention"), (FT1, "cross_entropy"), (FT1, "adamw"),
                                    (GPT4, "layernorm")], ids=lambda v: v if isinstance(v, str) else v.norm)
def test_each_kernel_can_be_switched_off(cfg, op, dev):
    r = check_against_reference(cfg, steps=3, device=dev, B=B, T=T, use_kernels={op: False})
    assert op not in r["kernels"] and op in r["requested_off"]
    assert r["ok"] and r["max_rel_err"] <= LOSS_RTOL and r["param_rel_err"] <= PARAM_RTOL


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "no-kernels"])
def test_weight_decay_groups_match_reference(use_kernels, dev):
    # A strong decay (lr * wd = 1e-3 per step) makes a wrong group visible: decaying the gains
    # and biases too, or nothing, moves the weights ~1e-3 relative, far over the 1e-5 tolerance.
    r = check_against_reference(GPT4, steps=3, device=dev, B=B, T=T, use_kernels=use_kernels,
                                lr=1e-3, weight_decay=1.0)
    assert r["param_rel_err"] <= PARAM_RTOL and r["max_rel_err"] <= LOSS_RTOL, r


# Only the optimizer matters here: the flat AdamW kernel, or torch's AdamW (its lazily made state).
# The embedding kernel is off too: its atomic adds on CUDA (kernels/embedding.py) may sum in
# another order on each run, and this test compares two engines bit for bit.
@pytest.mark.parametrize("use_kernels", [{"layernorm": False, "cross_entropy": False, "embedding": False}, False],
                         ids=["flat-adamw", "torch-adamw"])
def test_warm_up_is_undone(use_kernels, dev):
    # On CUDA the engine runs warm-up steps before capture and then restores the weights and a
    # fresh optimizer; run that again here (on CUDA after the capture, which has already warmed
    # up once) and check training is still the same as an engine that was not warmed up again.
    cfg = GPT4
    batches = pattern_batches(cfg.vocab_size, B, T, 3, seed=2)
    plain = Engine(cfg, B, T, "fp32", dev, use_kernels=use_kernels)
    warmed = Engine(cfg, B, T, "fp32", dev, use_kernels=use_kernels)
    warmed._warm_up(2)
    assert torch.equal(warmed.flat_param, plain.flat_param)
    for x, y in batches:
        assert torch.equal(warmed.step(x, y), plain.step(x, y))
    assert torch.equal(warmed.flat_param, plain.flat_param)


def test_all_kernels_off_is_the_reference_bit_for_bit():
    # Same ops and the same torch AdamW as the reference; only the buffers are flat, and an
    # in-place add of a gradient into zeros is exact. Any difference is a packing bug.
    for cfg in (FT1_L2_HS8, GPT4):
        r = check_against_reference(cfg, steps=4, device="cpu", B=B, T=T, use_kernels=False)
        assert r["kernels"] == [] and r["max_rel_err"] == 0.0 and r["param_rel_err"] == 0.0


def test_bf16_autocast_runs_and_stays_close(dev):
    r = check_against_reference(FT1, steps=2, device=dev, precision="bf16", B=B, T=T)
    assert r["ok"], r["max_rel_err"]  # ftlib.harness.bench.step.CHECK_RTOL['bf16'] = 3e-2


def test_engine_mode_in_bench_step(dev):
    tiny = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, block_size=8)
    row = bench_step(tiny, 2, 8, "engine", "fp32", dev, warmup=2, iters=2)
    assert row["status"] == "ok", row.get("traceback")
    assert row["check_ok"] and row["check_rel_err"] < 1e-5
    assert row["optimizer"] == "flat-adamw-triton" and row["engine"]["captured"] is (dev.type == "cuda")
    assert row["n_params"] == build_model(tiny).num_params()
    off = bench_step(tiny, 2, 8, "engine", "fp32", dev, warmup=2, iters=1, check=False,
                     extra={"use_kernels": {"attention": False}})
    assert off["status"] == "ok" and "attention" not in off["engine"]["kernels"]
    assert off["key"] != row["key"]  # the variant is its own measurement


def test_norm_dw_partials_reach_the_norm_kernels(dev):
    # The first norm's own kernel runs its backward only without first_norm_into_buffer (a default).
    own = {"first_norm_into_buffer": False}
    eng = Engine(FT1, B, T, "fp32", dev, norm_dw_partials="persistent", **own)
    assert eng.model.add_norm.dw_partials == "persistent" and eng.model.blocks[0].norm1.dw_partials == "persistent"
    assert eng.describe()["norm_dw_partials"] == "persistent"
    assert Engine(FT1, B, T, "fp32", dev, **own).model.blocks[0].norm1.dw_partials == "tile"  # the default
    assert Engine(FT1, B, T, "fp32", dev, use_kernels=False).describe()["norm_dw_partials"] is None
    with pytest.raises(ValueError, match="norm_dw_partials='tiles'"):
        EngineOptions(norm_dw_partials="tiles")


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="unknown kernel op"):
        EngineOptions(use_kernels={"softmax": False})
    with pytest.raises(ValueError, match="unknown engine option"):
        Engine(FT1, B, T, "fp32", "cpu", fuse_everything=True)
    with pytest.raises(ValueError, match="CUDA"):
        Engine(FT1, B, T, "fp32", "cpu", capture=True)
    with pytest.raises(ValueError, match="precision"):
        Engine(FT1, B, T, "fp64", "cpu")
    eng = Engine(FT1, B, T, "fp32", "cpu", use_kernels=False)
    with pytest.raises(ValueError, match=re.escape(f"({B}, {T})")):
        eng.step(torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, 8, dtype=torch.long))


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "no-kernels"])
def test_grad_clip_equals_clip_grad_norm(use_kernels, dev):
    # The engine clips the flat grad buffer in place before AdamW and leaves it there after the
    # step; the reference clips per-parameter grads with torch.nn.utils.clip_grad_norm_.
    (x, y), = pattern_batches(FT1.vocab_size, B, T, 1, seed=4, device=dev)
    ref = build_model(FT1, seed=1).to(dev)
    ref(x, y)[1].backward()
    norm = float(torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for p in ref.parameters()])))
    for clip in (norm / 4, norm * 4):  # active, then a no-op
        eng = Engine(FT1, B, T, "fp32", dev, use_kernels=use_kernels, seed=1, grad_clip=clip)
        eng.step(x, y)
        ref = build_model(FT1, seed=1).to(dev)
        ref(x, y)[1].backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
        for name, p in ref.named_parameters():
            off, n = eng.spans[name]
            torch.testing.assert_close(eng.flat_grad[off : off + n].view_as(p), p.grad, rtol=1e-4, atol=1e-7,
                                       msg=lambda m, name=name: f"{name}: {m}")
        clipped = float(torch.linalg.vector_norm(eng.flat_grad))
        assert clipped == pytest.approx(min(clip, norm), rel=1e-4)
    assert eng.describe()["grad_clip"] == clip
    with pytest.raises(ValueError, match="grad_clip=0"):
        Engine(FT1, B, T, "fp32", dev, grad_clip=0)


def test_bias_kernel_swaps_only_linears_with_a_bias(dev):
    # grad_into_buffer off: it would wrap the swapped layers (tests/test_grad_into_buffer.py covers that)
    gpt = Engine(GPT4, B, T, "fp32", dev, bias_kernel=True, grad_into_buffer=False)
    assert type(gpt.model.blocks[0].attn.qkv).__name__ == "BiasLinear" and gpt.describe()["bias_kernel"]
    assert type(gpt.model.head).__name__ == "Linear"  # the head has no bias
    ft = Engine(FT1, B, T, "fp32", dev, bias_kernel=True)
    assert "no biases" in ft.notes["bias"] and not ft.describe()["bias_kernel"]
    x3 = Engine(GPT4, B, T, "fp32", dev, bias_kernel=True, linear_precision="tf32x3")
    assert "Triton GEMM" in x3.notes["bias"]
    # On by default; off with every kernel off, and on request.
    assert Engine(GPT4, B, T, "fp32", dev).describe()["bias_kernel"]
    none = Engine(GPT4, B, T, "fp32", dev, use_kernels=False)
    assert not none.describe()["bias_kernel"] and "use_kernels=False" in none.notes["bias"]
    plain = Engine(GPT4, B, T, "fp32", dev, bias_kernel=False, grad_into_buffer=False)
    assert type(plain.model.blocks[0].attn.qkv) is torch.nn.Linear


def test_attention_kernel_runs_with_residual_dropout_but_not_attention_dropout(dev):
    drop = Engine(FT1.replace(dropout=0.1), B, T, "tf32", dev)
    assert not drop.kernels["attention"] and "attention dropout 0.1" in drop.notes["attention"]
    split = Engine(FT1.replace(dropout=0.1, attn_dropout=0.0), B, T, "tf32", dev, fuse_dropout=False)
    assert split.kernels["attention"] and split.model.blocks[0].attn.resid_dropout.p == 0.1
    fused = Engine(FT1.replace(dropout=0.1, attn_dropout=0.0), B, T, "tf32", dev, fuse_dropout=True)
    assert fused.kernels["attention"] and fused.resid_dropout[0] == 0.1 and fused.describe()["fuse_dropout"]
    assert type(fused.model.blocks[0].attn.resid_dropout) is torch.nn.Identity


@pytest.mark.parametrize("cfg,rng4", [(FT1.replace(n_layer=2), False), (GPT4, False), (FT1.replace(n_layer=2), True)],
                         ids=["ft-rms", "gpt2-ln", "ft-rms-philox-per-4"])
def test_fused_residual_dropout_is_dropout_with_the_kernels_masks(cfg, rng4, dev):
    """The engine's step with residual dropout inside the fused norms equals the model's own
    forward with those masks applied to each branch output (salt k for the k-th residual add):
    same loss, same gradient of every parameter. The embedding dropout (a module, torch's RNG)
    is switched off on both sides so that the masks are the only randomness."""
    from ftlib.model.reference import dropout_ref
    from kernels.residual_norm import keep_mask

    cfg = cfg.replace(dropout=0.2, attn_dropout=0.0)
    (x, y), = pattern_batches(cfg.vocab_size, B, T, 1, seed=7, device=dev)
    # Uncaptured (on CUDA too): the model is changed after construction, which a graph captured
    # at construction would not see.
    eng = Engine(cfg, B, T, "fp32", dev, seed=4, fuse_dropout=True, dropout_rng4=rng4, capture=False)
    eng.model.drop = torch.nn.Identity()
    loss = float(eng.step(x, y))
    seed = eng.resid_dropout[1]  # the value this step drew its masks from
    ref = build_model(cfg, seed=4).to(dev)
    ref.train()
    masks = iter(keep_mask(seed, (B, T, cfg.n_embd), 0.2, salt, rng4) for salt in range(1, 2 * cfg.n_layer + 1))
    h = ref.wte(x) + ref.wpe(torch.arange(T, device=dev))
    for blk in ref.blocks:
        blk.attn.resid_dropout = blk.mlp.dropout = torch.nn.Identity()
        h = h + dropout_ref(blk.attn(blk.norm1(h)), next(masks), 0.2)
        h = h + dropout_ref(blk.mlp(blk.norm2(h)), next(masks), 0.2)
    ref_loss = torch.nn.functional.cross_entropy(ref.head(ref.norm_f(h)).view(B * T, -1), y.view(-1))
    ref_loss.backward()
    assert loss == pytest.approx(float(ref_loss.detach()), rel=1e-5)
    for name, p in ref.named_parameters():
        off, n = eng.spans[name]
        torch.testing.assert_close(eng.flat_grad[off : off + n].view_as(p), p.grad, rtol=1e-4, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")
    # The next step draws new masks: the seed tensor moved on.
    before = int(seed)
    eng.step(x, y)
    assert int(eng.resid_dropout[1]) == before + 1


def test_fused_dropout_needs_the_fused_norm_and_dropout(dev):
    off = Engine(FT1.replace(dropout=0.1), B, T, "fp32", dev, fuse_residual_norm=False, fuse_dropout=True)
    assert off.resid_dropout is None and "needs the fused residual-norm" in off.notes["fuse_dropout"]
    assert Engine(FT1, B, T, "fp32", dev, fuse_dropout=True).resid_dropout is None  # dropout 0: nothing to fuse
    # On by default with one Philox call per 4 columns (the H200 winner: Engine's docstring).
    default = Engine(FT1.replace(dropout=0.1), B, T, "fp32", dev)
    assert default.resid_dropout is not None and default.resid_dropout[2] is True
    assert Engine(FT1.replace(dropout=0.1), B, T, "fp32", dev, fuse_dropout=False).resid_dropout is None


def test_bf16_norm_out_only_under_bf16_and_trains_like_the_default(dev):
    (x, y), = pattern_batches(FT1.vocab_size, B, T, 1, seed=4)
    on = Engine(FT1, B, T, "bf16", dev, seed=2)  # on by default
    off = Engine(FT1, B, T, "bf16", dev, seed=2, bf16_norm_out=False)
    assert on.describe()["bf16_norm_out"] and not off.describe()["bf16_norm_out"]
    for _ in range(2):
        a, b = float(on.step(x, y)), float(off.step(x, y))
        assert a == pytest.approx(b, rel=2e-2)  # the interpreter truncates to bf16, the GPU rounds
    fp32 = Engine(FT1, B, T, "fp32", dev, bf16_norm_out=True)
    assert not fp32.describe()["bf16_norm_out"] and "needs precision='bf16'" in fp32.notes["bf16_norm_out"]


def test_bf16_weights_shadow_every_linear_and_train_like_the_default(dev):
    (x, y), = pattern_batches(GPT4.vocab_size, B, T, 1, seed=6)
    # lr 1e-2: a shadow one step behind would change the next step's loss by far more than 1e-3
    # The bias kernel off: its Linears keep autocast's casts (the shadow is for plain nn.Linear).
    # grad_into_buffer off: it would wrap the shadow layers (tests/test_grad_into_buffer.py covers that).
    plain = {"bias_kernel": False, "grad_into_buffer": False}
    on = Engine(GPT4, B, T, "bf16", dev, seed=3, lr=1e-2, **plain)  # bf16_weights on by default
    off = Engine(GPT4, B, T, "bf16", dev, seed=3, bf16_weights=False, lr=1e-2, **plain)
    n_linear = sum(type(m) is torch.nn.Linear for m in off.model.modules())
    assert sum(type(m).__name__ == "ShadowLinear" for m in on.model.modules()) == n_linear > 0
    assert on.describe()["bf16_weights"] and on.flat_param16.numel() == on.n_decay
    for _ in range(3):
        assert float(on.step(x, y)) == pytest.approx(float(off.step(x, y)), rel=1e-3)
    torch.testing.assert_close(on.flat_param, off.flat_param, atol=1e-5, rtol=1e-3)
    assert not Engine(GPT4, B, T, "fp32", dev, bf16_weights=True).describe()["bf16_weights"]


def test_the_uncaptured_cuda_step_skips_the_target_check_that_direct_calls_keep(dev, monkeypatch):
    # The fused cross-entropy checks its targets with a host sync: the engine's step on CUDA must
    # not sync (its targets are its own static buffer), a direct call keeps the check.
    import kernels.cross_entropy as ce

    calls = []
    real = ce.check_targets_in_range
    monkeypatch.setattr(ce, "check_targets_in_range", lambda *a: (calls.append(a), real(*a))[1])
    eng = Engine(FT1, B, T, "fp32", dev, capture=False)
    assert eng.kernels["cross_entropy"] and not eng.captured
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, FT1.vocab_size, (B, T), generator=g).to(dev) for _ in range(2))
    assert torch.isfinite(eng.step(x, y)).item()
    assert len(calls) == (0 if dev.type == "cuda" else 1), f"{len(calls)} target checks in one step on {dev}"
    with pytest.raises(ValueError, match="targets must be class indices"):
        ce.cross_entropy(torch.zeros(4, 5, device=dev), torch.tensor([0, 1, 2, 9], device=dev))
    assert len(calls) == (1 if dev.type == "cuda" else 2)
