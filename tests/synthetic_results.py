"""Synthetic result rows for testing chapter 6's views before real GPU rows exist.

Written into a temporary results directory (FTLIB_RESULTS_DIR), never into data/results.
The numbers are chosen so every verdict is known in advance: the FastTransformer engine
meets the 1.5x target in fp32 and misses it in tf32; the GPT-2 engine beats compile-ro in
fp32 and loses in tf32.
"""

from __future__ import annotations

from pathlib import Path

from ftlib.harness.bench.cases import Case
from ftlib.harness.results import ResultStore, row_key
from ftlib.harness.suites import STEP_CONFIGS, with_run
from ftlib.model.config import preset

SLUG = "h200"
PROV = {"device": "NVIDIA H200", "device_type": "cuda", "torch": "2.11.0+cu130", "triton": "3.6.0",
        "date": "2026-12-03T10:00:00Z", "commit": "synthetic"}
# (model, precision, mode) -> median ms
STEP_MS = {
    ("gpt2", "fp32", "eager"): 15.4, ("gpt2", "fp32", "cudagraph"): 11.7, ("gpt2", "fp32", "compile"): 12.6,
    ("gpt2", "fp32", "compile-ro"): 8.9,
    ("fasttransformer", "fp32", "eager"): 16.8, ("fasttransformer", "fp32", "cudagraph"): 7.1,
    ("fasttransformer", "fp32", "compile"): 11.3, ("fasttransformer", "fp32", "compile-ro"): 5.9,
    ("gpt2", "tf32", "eager"): 18.7, ("gpt2", "tf32", "compile-ro"): 5.4,
    ("fasttransformer", "tf32", "eager"): 17.8, ("fasttransformer", "tf32", "compile-ro"): 3.9,
}
# The engine's own run: engine, compile-ro and cudagraph measured together.
ENGINE_MS = {
    ("fasttransformer", "fp32"): {"engine": 3.6, "compile-ro": 6.0, "cudagraph": 7.2},  # 1.67x: met
    ("fasttransformer", "tf32"): {"engine": 3.0, "compile-ro": 3.9, "cudagraph": 4.5},  # 1.30x: not met
    ("gpt2", "fp32"): {"engine": 8.0, "compile-ro": 8.8, "cudagraph": 11.6},  # faster: met
    ("gpt2", "tf32"): {"engine": 5.0, "compile-ro": 4.8, "cudagraph": 6.0},  # slower: not met
}
# Engine variants (fp32): label suffix -> median ms
VARIANT_MS = {"fasttransformer": {"-rmsnorm": 3.9, "-attention": 4.4, "no-kernels": 5.0},
              "gpt2": {"-layernorm": 8.1, "+flash-attn": 6.5}}


def _step_row(bench: str, model: str, prec: str, mode: str, ms: float, label: str | None = None,
              extra: dict | None = None) -> dict:
    cfg = preset(model)
    label = label or model
    return {"key": row_key(bench, cfg.config_hash(), 32, 256, mode, prec, {"label": label, **(extra or {})}),
            "bench": bench, "label": label, "preset": model, "config": cfg.to_dict(),
            "config_hash": cfg.config_hash(), "B": 32, "T": 256, "mode": mode, "precision": prec, "status": "ok",
            "median_ms": ms, "p20_ms": 0.97 * ms, "p80_ms": 1.04 * ms, "check_ok": True, "extra": extra or {},
            "engine": {"kernels": _kernels(label)} if mode == "engine" else None, **PROV}


def _kernels(label: str) -> list[str]:
    """The kernels an engine variant reports: the default's, less what its label switched off."""
    if label.endswith("no-kernels"):
        return []
    return [k for k in ("rmsnorm", "attention", "cross_entropy", "adamw") if not label.endswith(f" -{k}")]


# The baselines suite: three runs on two machine starts; per (model, mode, optimizer) ms, every precision.
BASELINE_MS = {("fasttransformer", "engine", "default"): 3.6, ("fasttransformer", "compile-ro", "whole-step"): 6.0,
               ("gpt2", "engine", "default"): 9.0, ("gpt2", "compile-ro", "fused"): 8.0}


def write_step_rows(root: Path) -> None:
    from ftlib.harness.suites import baselines

    store = ResultStore("baselines", SLUG, root)
    for i in range(3):
        for row in baselines_run(f"run{i}", f"machine{i % 2}", BASELINE_MS, cases=baselines()):
            store.append(row)


def write_engine_rows(root: Path) -> None:
    store = ResultStore("engine", SLUG, root)
    for (model, prec), modes in ENGINE_MS.items():
        for mode, ms in modes.items():
            store.append(_step_row("engine", model, prec, mode, ms))
    for model, variants in VARIANT_MS.items():
        for suffix, ms in variants.items():
            store.append(_step_row("engine", model, "fp32", "engine", ms, label=f"{model} engine {suffix}",
                                   extra={"variant": suffix}))
    # An alternative route to a target (engineview.ALTERNATIVES): GPT-2 tf32 with the attention
    # kernel, faster than compile-ro (4.8) where the headline engine (5.0) is not.
    store.append(_step_row("engine", "gpt2", "tf32", "engine", ALT_GPT2_TF32_MS, label="gpt2 engine +flash-attn",
                           extra={"attention_for_explicit": True}))


ALT_GPT2_TF32_MS = 4.2
# An engine option not yet a default (suite engine_candidates): the default case and the option's, one run.
CANDIDATE_MS = {"fasttransformer": 1.74, "fasttransformer +grad-into-buffer": 1.60}


def write_candidate_rows(root: Path) -> None:
    store = ResultStore("engine_candidates", SLUG, root)
    for label, ms in CANDIDATE_MS.items():
        extra = {"run": "c1", **({"grad_into_buffer": True} if "+" in label else {})}
        store.append({**_step_row("engine_candidates", "fasttransformer", "bf16", "engine", ms, label=label,
                                  extra=extra), "run_id": "c1"})


def write_probe_rows(root: Path) -> None:
    """Two profiled engine steps (benchmarks/kernels/engine_probe.py's rows)."""
    store = ResultStore("engine_probe", SLUG, root)
    kernels = [{"name": "sm90_xmma_gemm_f32f32_tf32f32", "count": 24, "us": 900.0},
               {"name": "_attn_bwd_dkdv_kernel", "count": 6, "us": 250.0},
               {"name": "_add_norm_fwd_kernel", "count": 12, "us": 100.0},
               {"name": "void at::native::reduce_kernel<128, 4>", "count": 26, "us": 200.0},
               {"name": "_adamw_kernel", "count": 1, "us": 20.0},
               {"name": "some_new_kernel", "count": 1, "us": 30.0}]
    for prec in ("tf32", "bf16"):
        store.append({"key": f"engine_probe|fasttransformer|{prec}", "bench": "engine_probe",
                      "label": "fasttransformer", "status": "ok", "preset": "fasttransformer", "precision": prec,
                      "B": 32, "T": 256, "step_median_us": 1600.0, "kernel_us": 1500.0, "kernels": kernels, **PROV})


def losses(start: float, steps: int, wiggle: float) -> list[float]:
    return [start * (0.97 ** k) * (1 + wiggle * (1 + k / steps) * ((-1) ** k)) for k in range(steps)]


def write_check_rows(root: Path, steps: int = 100) -> None:
    store = ResultStore("engine_check", SLUG, root)
    for prec in ("fp32", "tf32"):
        for model in ("gpt2", "fasttransformer"):
            ref = losses(4.2, steps, 0.0)
            eng = losses(4.2, steps, 2e-6 if prec == "fp32" else 2e-4)
            rel = max(abs(e - r) / r for e, r in zip(eng, ref))
            store.append({"key": f"check-{model}-{prec}", "bench": "engine_check", "label": model, "preset": model,
                          "B": 32, "T": 256, "mode": "engine", "precision": prec, "status": "ok", "steps": steps,
                          "losses_engine": eng, "losses_ref": ref, "max_rel_err": rel, "rtol": 1e-3,
                          "ok": rel <= 1e-3, "check_ok": rel <= 1e-3, "param_rel_err": 1e-6,
                          "kernels": ["rmsnorm", "cross_entropy", "adamw"], **PROV})


def _krow(op: str, case: dict, dtype: str, variant: str, impl: str, timing: str, us: float | None,
          nbytes: float | None, flops: float | None, bound: str, precision: str | None = None,
          status: str = "ok", note: str = "") -> dict:
    rate_b = nbytes / (us * 1e-6) / 1e9 if (us and nbytes) else None
    rate_f = flops / (us * 1e-6) / 1e12 if (us and flops) else None
    return {"key": f"{op}-{variant}-{dtype}-{sorted(case.items())}-{timing}", "bench": "kernels", "op": op,
            "variant": variant, "impl": impl, "case": f"{op} {case} {dtype}", "shape": case, "dtype": dtype,
            "precision": precision or dtype, "timing": timing, "status": status, "note": note,
            "median_us": us, "p20_us": us and 0.95 * us, "p80_us": us and 1.05 * us, "bytes": nbytes,
            "flops": flops, "bound": bound, "gb_s": rate_b, "tflop_s": rate_f, "check_err": 1e-7,
            "check_tol": 1e-5, "check_ok": True, **PROV}


# Measured ceilings: 4000 GB/s copy, 50 / 400 / 800 TFLOP/s matmuls.
CEIL = {"copy": 4000.0, "matmul fp32": 50.0, "matmul tf32": 400.0, "matmul bf16": 800.0}
NORM_BYTES = 5 * 8192 * 256 * 4  # 41.9 MB -> floor 10.49 us at 4000 GB/s


def write_kernel_rows(root: Path) -> None:
    store = ResultStore("kernels", SLUG, root)
    for variant, rate in CEIL.items():
        copy = variant == "copy"
        nbytes, flops = (2.0 * 2**30, None) if copy else (3.0 * 8192**2 * 4, 2.0 * 8192**3)
        us = (nbytes / (rate * 1e9) if copy else flops / (rate * 1e12)) * 1e6
        store.append(_krow("ceiling", {"M": 8192}, "fp32", variant, "pytorch", "eager", us, nbytes, flops,
                           "memory" if copy else "compute", precision=variant.split()[-1] if not copy else "fp32"))
    norm = {"M": 8192, "N": 256}
    for variant, impl, eager, graph in (("v1 eager", "pytorch", 550.0, 60.0), ("v2 torch.compile", "compile", 400.0,
                                        25.0), ("v3 triton", "triton", 420.0, 20.0)):
        for timing, us in (("eager", eager), ("graph", graph)):
            store.append(_krow("rmsnorm", norm, "fp32", variant, impl, timing, us, NORM_BYTES, None, "memory"))
    # AdamW foreach: not capturable, its graph row says so.
    ad = {"n_params": 2559744, "tensors": 40, "steps": 3}
    nb = 28.0 * 2559744 * 3
    store.append(_krow("adamw", ad, "fp32", "v1 foreach", "pytorch", "eager", 1500.0, nb, None, "memory"))
    store.append(_krow("adamw", ad, "fp32", "v1 foreach", "pytorch", "graph", None, nb, None, "memory",
                       status="unsupported", note="not capturable"))
    store.append(_krow("adamw", ad, "fp32", "v4 triton flat", "triton", "eager", 180.0, nb, None, "memory"))
    store.append(_krow("adamw", ad, "fp32", "v4 triton flat", "triton", "graph", 70.0, nb, None, "memory"))
    att = {"B": 32, "nh": 8, "nkv": 1, "T": 256, "hs": 32}
    fl = 4 * 32 * 8 * 256 * 256 * 32 / 2 * 3.5
    ab = 6 * (32 * 8 * 256 * 32 + 32 * 256 * 32) * 4
    # fp32 operands: SDPA and a strict-fp32 Triton variant are one case, the TF32-product variant another
    for variant, impl, prec, g in (("v2 sdpa expand", "pytorch", "fp32", 300.0), ("v3 triton ieee", "triton", "fp32",
                                                                                   600.0),
                                   ("v4 triton tf32", "triton", "tf32", 150.0)):
        for timing, us in (("eager", 2 * g), ("graph", g)):
            store.append(_krow("attention", att, "fp32", variant, impl, timing, us, ab, fl, "compute", precision=prec))


def write_all(root: Path) -> Path:
    write_step_rows(root)
    write_engine_rows(root)
    write_candidate_rows(root)
    write_probe_rows(root)
    write_check_rows(root)
    write_kernel_rows(root)
    return root


# ---------------------------------------------------------------- the baselines suite, run by run

BASELINE_MODELS = {"gpt2": preset("gpt2"), "fasttransformer": preset("fasttransformer")}
BASELINE_CASES = [Case(label, cfg, 32, 256, mode, "bf16", optimizer=opt) for label, cfg in BASELINE_MODELS.items()
         for mode, opt in STEP_CONFIGS]


def baselines_run(run: str, machine: str, ms: dict[tuple[str, str, str], float], commit: str = "0123456789ab",
                  skip: tuple = (), bad: dict | None = None, cases: list | None = None) -> list[dict]:
    """Rows of one run of the baselines suite (``cases``, default BASELINE_CASES).

    Each case takes ``ms[(label, mode, optimizer)]`` or 10 ms; ``bad`` overrides fields per case.
    """
    rows = []
    for c in with_run(cases or BASELINE_CASES, run):
        ident = (c.label, c.mode, c.optimizer)
        if ident in skip:
            continue
        row = {"key": c.key("baselines"), "bench": "baselines", "label": c.label, "config": c.config.to_dict(),
               "config_hash": c.config.config_hash(), "B": c.B, "T": c.T, "mode": c.mode, "precision": c.precision,
               "optimizer_kind": c.optimizer, "extra": c.extra, "status": "ok", "check_ok": True,
               "median_ms": ms.get(ident, 10.0), "p20_ms": 0, "p80_ms": 0, "device_slug": "h200",
               "device": "NVIDIA H200", "run_id": run, "machine_id": machine, "commit": commit,
               "date": "2026-12-03T10:00:00Z"}
        if c.mode == "engine":  # the engine's describe(): today's options, as applied
            bias = c.config.bias  # GPT-2's bias options apply to it alone; the bf16 shadow in bf16 alone
            row["engine"] = {"grad_into_buffer": True, "fuse_kv_split_sum": c.config.n_kv_head < c.config.n_head,
                             "fuse_residual_norm": True, "norm_dw_into_buffer": True,
                             "norm_bwd_grid": "8 rows 4/SM", "first_norm_into_buffer": True,
                             "bias_into_buffer": bias, "branch_bias_into_norm": bias, "fc_bias_into_gelu": bias,
                             "bf16_bias_weights": bias and c.precision == "bf16",
                             "wgrad_side_stream": c.precision in ("bf16", "fp16"),
                             "attention_bwd_streams": c.config.attn_impl == "sdpa" or bool(c.extra.get(
                                 "attention_for_explicit")),
                             # the flash kernel's dK/dV split: two per K/V head where 2 divides its query heads
                             "attention_kv_split": 2 if (c.config.attn_impl == "sdpa"
                                                         and (c.config.n_head // c.config.n_kv_head) % 2 == 0)
                             else None,
                             "fuse_embedding": True, "relaxed_atomics": True, "fuse_head_loss": True,
                             "attention_heavy_first": True, "explicit_heavy_first": True}
        row.update((bad or {}).get(ident, {}))
        rows.append(row)
    return rows


def fast(**by_config: float) -> dict:
    """Times per (label, mode, optimizer) from keywords like gpt2__compile_ro__fused=3.0."""
    out = {}
    for k, v in by_config.items():
        label, mode, opt = k.split("__")
        out[(label, mode.replace("_", "-"), opt.replace("_", "-"))] = v
    return out
