"""ftlib.harness.profiling on CPU: kernel-name classes, SDPA backend detection, trace attribution, storage."""

from __future__ import annotations

import json

import pytest

from ftlib.harness.profiling import profile_step, profile_suite, to_row
from ftlib.harness.trace import (
    CATEGORIES,
    PHASES,
    classify_kernel,
    parse_trace,
    sdpa_backend_from_ops,
    split_graph_step,
)
from ftlib.model.config import preset
from ftlib.views.profile import phase_breakdown, to_rows

TINY = dict(n_layer=1, n_embd=32, n_head=4, block_size=16)
B, T = 2, 8
FAST = dict(steps=2, warmup=1, timing_steps=3, device="cpu")

KERNEL_NAMES = [
    ("ampere_sgemm_128x64_tn", "matmul"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_"
     "kernel__5x_cublas", "matmul"),
    ("nvjet_tst_128x64_64x6_1x1_v_bz_coopA_NNT", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(Params)", "matmul"),
    ("triton_tem_fused_mm_0", "matmul"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", "attention"),
    ("fmha_cutlassB_f32_aligned_64x64_k64_sm80", "attention"),
    ("flash_fwd_kernel", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "attention"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
     "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>", "softmax"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 8, false, true>", "softmax"),
    ("triton_per_fused__softmax_3", "softmax"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>", "norm"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1", "norm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
     "at::native::GeluType)::{lambda()#2}::operator()() const>", "elementwise"),
    ("triton_poi_fused_add_0", "elementwise"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4>>", "optimizer"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t>>",
     "reduction"),
    ("Memcpy DtoD (Device -> Device)", "memcpy/memset"),
    ("Memset (Device)", "memcpy/memset"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
     "std::array<char*, 1ul>>", "memcpy/memset"),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>",
     "other"),
    # CPU traces: aten ops and autograd wrappers
    ("aten::addmm", "matmul"),
    ("aten::bmm", "matmul"),
    ("aten::_softmax", "softmax"),
    ("aten::native_layer_norm", "norm"),
    ("aten::add_", "elementwise"),
    ("aten::lerp_", "elementwise"),
    ("aten::_foreach_mul_", "optimizer"),
    ("aten::copy_", "memcpy/memset"),
    ("aten::sum", "reduction"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::view", "other"),
    ("autograd::engine::evaluate_function: MmBackward0", "other"),
    ("AddmmBackward0", "other"),
]


@pytest.mark.parametrize(("name", "category"), KERNEL_NAMES)
def test_classify_kernel(name: str, category: str) -> None:
    assert category in CATEGORIES
    assert classify_kernel(name) == category


@pytest.mark.parametrize(("names", "backend"), [
    (["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_efficient_attention",
      "fmha_cutlassF_f32_aligned_64x64_rf_sm80"], "mem_efficient"),
    (["fmha_cutlassB_f32_aligned_64x64_k64_sm80"], "mem_efficient"),
    (["aten::_scaled_dot_product_flash_attention", "flash_fwd_kernel"], "flash"),
    (["aten::_scaled_dot_product_cudnn_attention", "cudnn_generated_fort_native_sdpa_sm90_flash_fprop"], "cudnn"),
    (["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math",
      "softmax_warp_forward", "ampere_sgemm_128x64_tn"], "math"),
    (["aten::_scaled_dot_product_flash_attention_for_cpu"], "flash (cpu)"),
    (["aten::scaled_dot_product_attention"], "unknown"),
    (["aten::bmm", "aten::_softmax", "cunn_SoftMaxForward"], "none (explicit softmax)"),
])
def test_sdpa_backend_from_names(names: list[str], backend: str) -> None:
    assert sdpa_backend_from_ops(names) == backend


@pytest.fixture(scope="module")
def ft_profile():
    return profile_step(preset("fasttransformer", **TINY), B, T, **FAST)


def test_profile_phases_cpu(ft_profile) -> None:
    p = ft_profile
    for ph in PHASES:
        assert p.phase_us.get(ph, 0) > 0, ph
    assert p.steps == FAST["steps"]
    step_us = p.step_ms_profiled * 1e3
    assert sum(p.phase_us.values()) <= step_us
    assert 0 < p.busy_us <= step_us
    assert p.gaps_us == pytest.approx(step_us - p.busy_us)
    assert {k.category for k in p.kernels} <= set(CATEGORIES)
    # the matmuls of forward and backward are seen in their phases
    cats = p.category_us()
    assert cats[("forward", "matmul")] > 0 and cats[("backward", "matmul")] > 0
    assert p.provenance["device_type"] == "cpu"


@pytest.mark.parametrize(("name", "overrides", "backend"), [
    ("fasttransformer", {"kv_layout": "broadcast"}, "math"),  # (B,1,T,d) K/V: math fallback, as on CUDA fp32
    ("fasttransformer", {"kv_layout": "expand"}, "flash (cpu)"),
    ("gpt2", {"n_kv_head": 4}, "none (explicit softmax)"),
])
def test_sdpa_backend_from_cpu_trace(name: str, overrides: dict, backend: str) -> None:
    p = profile_step(preset(name, **{**TINY, **overrides}), B, T, steps=1, warmup=1, timing_steps=1, device="cpu")
    assert p.sdpa_backend == backend


def test_graph_modes_need_cuda() -> None:
    with pytest.raises(ValueError, match="CUDA"):
        profile_step(preset("gpt2", **TINY, n_kv_head=4), B, T, mode="cudagraph", device="cpu")
    with pytest.raises(ValueError, match="unknown mode"):
        profile_step("gpt2", B, T, mode="max-autotune", device="cpu")


def _ann(name, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur, "tid": 1, "args": {}}


def _launch(corr, ts, name="cudaLaunchKernel", tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": 1, "tid": tid,
            "args": {"correlation": corr}}


def _kernel(name, corr, ts, dur):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "tid": 7,
            "args": {"correlation": corr}}


def test_parse_gpu_trace_attributes_by_launch() -> None:
    events = [
        _ann("ftlib::step", 0, 100),
        _ann("ftlib::forward", 1, 20), _ann("ftlib::backward", 22, 30), _ann("ftlib::optimizer", 60, 10),
        _launch(1, 2), _launch(2, 5), _launch(3, 25, tid=2), _launch(4, 61, name="cuLaunchKernel"),
        # kernel 2 is launched in forward but runs while the CPU is already in backward
        _kernel("ampere_sgemm_128x64_tn", 1, 10, 10), _kernel("triton_poi_fused_add_0", 2, 24, 4),
        _kernel("fmha_cutlassB_f32_aligned_64x64_k64_sm80", 3, 26, 20),
        _kernel("multi_tensor_apply_kernel<FusedAdamMathFunctor>", 4, 70, 5),
        _kernel("ampere_sgemm_128x64_tn", 99, 200, 5),  # outside every step: dropped
    ]
    (w,) = parse_trace(events, gpu=True)
    assert [(e.name.split("<")[0], e.phase) for e in sorted(w.work, key=lambda e: e.ts)] == [
        ("ampere_sgemm_128x64_tn", "forward"), ("triton_poi_fused_add_0", "forward"),
        ("fmha_cutlassB_f32_aligned_64x64_k64_sm80", "backward"), ("multi_tensor_apply_kernel", "optimizer"),
    ]
    assert w.busy_us() == pytest.approx(10 + 22 + 5)  # [10,20] + [24,46] (overlap merged) + [70,75]
    assert w.launches == 4


def test_split_whole_step_graph() -> None:
    seq = ["f1", "f2", "b1", "b2", "b3", "o1"]
    events = [_ann("ftlib::step", 0, 100), _launch(1, 1, name="cudaGraphLaunch")]
    events += [_kernel(n, 1, 10 + 5 * i, 4) for i, n in enumerate(seq)]
    (w,) = parse_trace(events, gpu=True)
    assert split_graph_step(w, {"forward": seq[:2], "forward+backward": seq[:5]})
    assert [e.phase for e in sorted(w.work, key=lambda e: e.ts)] == ["forward"] * 2 + ["backward"] * 3 + [
        "optimizer"]
    assert w.launches == 1
    assert not split_graph_step(w, {"forward": ["x"], "forward+backward": seq[:5]})
    assert {e.phase for e in w.work} == {"step"}


def test_rows_are_json(ft_profile) -> None:
    row = to_row(ft_profile)
    json.dumps(row, allow_nan=False)
    tidy = to_rows(row)
    assert tidy and {"phase", "category", "name", "count", "total_us", "key", "mode"} <= set(tidy[0])
    parts = phase_breakdown([row])
    assert {r["phase"] for r in parts} >= {*PHASES, "launch gaps"}


def test_profile_suite_stores_and_skips(tmp_path) -> None:
    kw = dict(B=B, T=T, device="cpu", steps=1, warmup=1, timing_steps=1, root=tmp_path, **TINY)
    rows = profile_suite(["fasttransformer"], ["eager"], ["fp32"], **kw)
    assert len(rows) == 1 and rows[0]["status"] == "ok"
    assert (tmp_path / "cpu" / "profile.jsonl").exists()
    assert profile_suite(["fasttransformer"], ["eager"], ["fp32"], **kw) == []  # already measured


def test_profile_figures_name_the_gpu_and_the_models_as_the_book_does() -> None:
    """The figures' titles give the GPU as its rows name it (not the folder's slug) and their bars the models
    as the book names them; a row without a device name falls back to its folder's name in capitals."""
    from ftlib.views.profile import category_figures, findings, graph_split, phase_figures, what_ran

    def row(model: str, prov: dict) -> dict:
        return {"preset": model, "mode": "eager", "precision": "fp32", "B": 32, "T": 256, "device_slug": "h100",
                "status": "ok", "phases": [{"phase": "forward", "total_us": 10.0}], "gaps_us": 1.0,
                "kernels": [{"category": "matmul", "total_us": 5.0}], "provenance": prov, "step_ms": 0.02,
                "step_ms_profiled": 0.03, "busy_us": 9.0, "kernels_per_step": 3, "launches_per_step": 3,
                "sdpa_backend": "math", "phase_source": "trace", "graph_phases": None}

    rows = [row("gpt2", {"device": "NVIDIA H100 80GB HBM3"}), row("fasttransformer", {})]
    (_, phases), = phase_figures(rows)
    assert phases.layout.title.text == "Phases of one training step, H100 80GB HBM3, fp32 (B=32, T=256)"
    assert list(phases.data[0].x[0]) == ["GPT-2", "FastTransformer"]
    (_, cats), = category_figures(rows[1:])
    assert cats.layout.title.text == "GPU time by kernel category, H100, fp32"
    assert list(cats.data[0].x[0]) == ["FastTransformer"]
    assert findings(rows).startswith("**H100 80GB HBM3, fp32:** ")
    # The tables name them the same way.
    ran = what_ran(rows)
    assert set(ran["device"]) == {"H100 80GB HBM3"} and list(ran["model"]) == ["GPT-2", "FastTransformer"]
    split = graph_split([{**rows[0], "mode": "cudagraph"}])
    assert set(split["device"]) == {"H100 80GB HBM3"} and set(split["model"]) == {"GPT-2"}


def test_heaviest_kernel_names_are_cut_in_the_middle_so_two_tilings_stay_apart():
    from ftlib.views.profile import short_kernel

    a = "void cutlass::Kernel2<cutlass_80_simt_sgemm_" + "x" * 80 + "_256x128_8x4_nn_align1>(Params)"
    b = a.replace("_nn_", "_tn_")
    assert short_kernel(a) != short_kernel(b) and len(short_kernel(a)) == 100 and "…" in short_kernel(a)
    assert short_kernel("sgemm") == "sgemm"


def test_the_closing_answers_the_posts_caption_from_the_phases():
    """'backward and MLP phases dominate': the closing says whether the backward outlasts the forward in every
    profile, and, where every eager step waits on its launches longer than on any phase, that it does."""
    from ftlib.views.profile import findings

    def row(model: str, mode: str, fwd: float, bwd: float, gaps: float) -> dict:
        phases = [{"phase": "forward", "total_us": fwd}, {"phase": "backward", "total_us": bwd},
                  {"phase": "optimizer", "total_us": 100.0}]
        return {"preset": model, "mode": mode, "precision": "fp32", "B": 32, "T": 256, "device_slug": "h100",
                "status": "ok", "phases": phases, "gaps_us": gaps, "kernels": [{"category": "matmul", "total_us": 5.0}],
                "provenance": {}, "step_ms": (fwd + bwd + 100.0 + gaps) / 1e3, "step_ms_profiled": 0.03,
                "busy_us": 9.0, "kernels_per_step": 3, "launches_per_step": 3, "sdpa_backend": "math",
                "phase_source": "trace", "graph_phases": None}

    text = findings([row("gpt2", "eager", 1000.0, 2000.0, 6900.0), row("gpt2", "cudagraph", 1000.0, 2500.0, 100.0)])
    assert "holds for the backward: in every profile it takes more GPU time than the forward (2.0–2.5×)" in text
    assert "waits on its launches for 69% of its time, longer than its longest phase" in text  # one value, once
    short_gaps = findings([row("gpt2", "eager", 1000.0, 2000.0, 1500.0)])
    assert "longer than its longest phase" not in short_gaps  # 1.5 ms of gaps against a 2 ms backward
    assert "does not hold for every profile" in findings([row("gpt2", "eager", 2000.0, 1000.0, 100.0)])
    assert "waits on its launches" not in findings([row("gpt2", "cudagraph", 1000.0, 2000.0, 50.0)])  # no eager
