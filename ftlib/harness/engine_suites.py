"""The engine's suites: its defaults with one piece changed at a time (``engine``), and the options on trial,
each beside the default engine it would change (``engine_candidates``). :mod:`ftlib.harness.suites` names them
with the other suites.
"""

from __future__ import annotations

from typing import Any

from ftlib.harness.bench.cases import HEADLINE_B, HEADLINE_PRECISIONS, HEADLINE_T, Case, headline_models

# The four options that won their trial for GPT-2's biases and first norm, all off: the engine before them
# (ablations in ``engine``, the probe's case).
BIAS_OPTIONS_OFF = {"bias_into_buffer": False, "bf16_bias_weights": False, "branch_bias_into_norm": False,
                    "first_norm_into_buffer": False}


def engine_variants() -> list[Case]:
    """The engine with its defaults, then with one piece changed at a time, both presets.

    Under bf16 each bf16-specific default and the bias kernel off; GPT-2 with the attention
    kernel in place of its explicit softmax (the same function) and with its fused softmax
    off; the fp32-accurate tensor-core routes (3xTF32) in fp32; in tf32 and fp32 each kernel
    off on its own, none at all, uncaptured, the residual add unfused, PyTorch's bias
    gradients, and the heads layout; in bf16 too, last, each kernel off, none at all and
    uncaptured. The norms' persistent weight-gradient partials come right after the defaults.
    Variants carry their engine options in ``extra``.
    """
    configs = headline_models()
    B, T = HEADLINE_B, HEADLINE_T
    flash = {"attention_for_explicit": True}
    x3, lin = {"attention_precision": "tf32x3"}, {"linear_precision": "tf32x3"}

    def case(label: str, name: str, prec: str, extra: dict | None = None) -> Case:
        return Case(label, configs[name], B, T, "engine", prec, dict(extra or {}))

    cases = [case(name, name, prec) for prec in HEADLINE_PRECISIONS for name in configs]
    # The norm backwards' persistent weight-gradient partials (a partial row per program, not per
    # tile), right after the defaults: a short run measures both.
    persistent = {"norm_dw_partials": "persistent"}
    cases += [case("fasttransformer persistent norm dw", "fasttransformer", prec, persistent)
              for prec in ("bf16", "tf32")]
    cases.append(case("gpt2 +flash-attn persistent norm dw", "gpt2", "bf16", {**flash, **persistent}))
    # The two defaults that won their trial in engine_candidates, each switched off again: the weight
    # gradients added by autograd (every model with a Linear), and MQA's dK/dV split partials summed by
    # torch (FastTransformer: GPT-2's MHA has no split).
    no_grad_into, no_kv_sum = {"grad_into_buffer": False}, {"fuse_kv_split_sum": False}
    for prec in ("bf16", "tf32"):
        cases += [case("fasttransformer -grad-into-buffer", "fasttransformer", prec, no_grad_into),
                  case("gpt2 +flash-attn -grad-into-buffer", "gpt2", prec, {**flash, **no_grad_into}),
                  case("fasttransformer -fused-kv-sum", "fasttransformer", prec, no_kv_sum)]
    cases += [case("gpt2 +flash-attn", "gpt2", prec, flash) for prec in ("bf16", "tf32")]
    cases += [case("gpt2 -fused-softmax", "gpt2", prec, {"fused_softmax": False})
              for prec in HEADLINE_PRECISIONS]
    cases += [case("fasttransformer, 3xTF32 attention", "fasttransformer", "fp32", x3),
              case("fasttransformer, 3xTF32 attention+linear", "fasttransformer", "fp32", {**x3, **lin}),
              case("gpt2 +flash-attn 3xTF32", "gpt2", "fp32", {**x3, **flash}),
              case("gpt2 +flash-attn 3xTF32 +linear", "gpt2", "fp32", {**x3, **lin, **flash})]
    cases += [case("fasttransformer -bf16 norm out", "fasttransformer", "bf16", {"bf16_norm_out": False}),
              case("fasttransformer -bf16 weights", "fasttransformer", "bf16", {"bf16_weights": False}),
              case("gpt2 +flash-attn -bf16 norm out", "gpt2", "bf16", {**flash, "bf16_norm_out": False}),
              case("gpt2 +flash-attn -bias-kernel", "gpt2", "bf16", {**flash, "bias_kernel": False}),
              case("gpt2 +flash-attn -bias-kernel", "gpt2", "tf32", {**flash, "bias_kernel": False})]
    for prec in ("tf32", "fp32"):
        for name, cfg in configs.items():
            ops = [cfg.norm] + (["attention"] if cfg.attn_impl == "sdpa" else []) + [
                "embedding", "cross_entropy", "adamw"]
            variants = [(f" -{op}", {"use_kernels": {op: False}}) for op in ops]
            variants += [(" no-kernels", {"use_kernels": False}), (" uncaptured", {"capture": False}),
                         (" unfused residual-norm", {"fuse_residual_norm": False})]
            if cfg.bias:  # GPT-2: its bias gradients back on PyTorch's dy.sum(0)
                variants.append((" -bias-kernel", {"bias_kernel": False}))
            if prec == "tf32":  # (in strict fp32 the layout does not apply: SDPA, or GPT-2's softmax)
                variants.append((" +flash-attn heads layout", {**flash, "attention_layout": "heads"})
                                if cfg.attn_impl == "explicit" else (" heads layout", {"attention_layout": "heads"}))
            cases += [case(name + suffix, name, prec, extra) for suffix, extra in variants]
    # The fused residual-norms' weight (and bias) gradients back on partial rows, a torch column sum
    # and autograd's add per norm, instead of atomic adds into the flat gradient. Appended last, so
    # the earlier cases keep their order.
    no_norm_dw_into = {"norm_dw_into_buffer": False}
    for prec in ("bf16", "tf32"):
        cases += [case("fasttransformer -norm-dw-into-buffer", "fasttransformer", prec, no_norm_dw_into),
                  case("gpt2 +flash-attn -norm-dw-into-buffer", "gpt2", prec, {**flash, **no_norm_dw_into})]
    # The fused residual-norm backward back on its launcher's grid (4-row tiles) instead of 8-row tiles.
    launcher_grid = {"norm_bwd_grid": None}
    for prec in ("bf16", "tf32"):
        cases += [case("fasttransformer -norm-bwd-grid", "fasttransformer", prec, launcher_grid),
                  case("gpt2 +flash-attn -norm-bwd-grid", "gpt2", prec, {**flash, **launcher_grid})]
    # GPT-2's explicit attention back on cuBLAS's batched GEMMs around the fused softmax, instead of one
    # kernel each way with the products fused (the probabilities written either way).
    cases += [case("gpt2 -fuse-softmax-matmuls", "gpt2", prec, {"fuse_softmax_matmuls": False})
              for prec in ("bf16", "tf32")]
    # GPT-2's bias gradients back on partial rows, torch sums and autograd's adds; its biased Linears back on
    # autocast's casts (bf16); its output projections' bias gradients back on column sums; every model's
    # first norm back on its own kernel's backward. Each alone, then all four at once.
    for prec in ("bf16", "tf32"):
        cases.append(case("gpt2 -bias-into-buffer", "gpt2", prec, {"bias_into_buffer": False}))
        if prec == "bf16":  # the shadow is bf16's
            cases.append(case("gpt2 -bf16-bias-weights", "gpt2", prec, {"bf16_bias_weights": False}))
        cases += [case("gpt2 -branch-bias-into-norm", "gpt2", prec, {"branch_bias_into_norm": False}),
                  *(case(f"{name} -first-norm-into-buffer", name, prec, {"first_norm_into_buffer": False})
                    for name in ("fasttransformer", "gpt2")),
                  case("gpt2 -bias-options", "gpt2", prec, BIAS_OPTIONS_OFF)]
    # GPT-2's dQ kernel back on two passes over each row's keys.
    cases += [case("gpt2 -explicit-dq-one-pass", "gpt2", prec, {"explicit_dq_one_pass": False})
              for prec in ("bf16", "tf32")]
    # GPT-2's up-projection bias gradient back on its own column-sum kernel, GELU's backward on torch's.
    cases += [case("gpt2 -fc-bias-into-gelu", "gpt2", prec, {"fc_bias_into_gelu": False})
              for prec in ("bf16", "tf32")]
    # The weight-gradient GEMMs back on the main stream (bf16: the option applies only there); the attention
    # backward's two kernels one after the other (the FastTransformer's flash attention).
    cases += [case(f"{name} -wgrad-stream", name, "bf16", {"wgrad_side_stream": False})
              for name in ("fasttransformer", "gpt2")]
    cases += [case("fasttransformer -attn-bwd-streams", "fasttransformer", prec, {"attention_bwd_streams": False})
              for prec in ("bf16", "tf32")]
    # MQA's dK/dV kernel back on its launcher's split (about two programs per SM) instead of two per K/V head.
    cases += [case("fasttransformer -kv-split-2", "fasttransformer", prec, {"attention_kv_split": None})
              for prec in ("bf16", "tf32")]
    # The embeddings' lookups, sum and table gradients back on PyTorch's gathers, add and scatter-adds.
    cases += [case(f"{name} -fused-embedding", name, prec, {"fuse_embedding": False})
              for prec in ("bf16", "tf32") for name in ("fasttransformer", "gpt2")]
    # The gradient kernels' atomic adds back on Triton's default acquire-release order.
    cases += [case(f"{name} -relaxed-atomics", name, prec, {"relaxed_atomics": False})
              for prec in ("bf16", "tf32") for name in ("fasttransformer", "gpt2")]
    # The head and the loss back on cuBLAS's GEMMs and the cross-entropy kernel (bf16: the option applies there).
    cases += [case(f"{name} -fused-head", name, "bf16", {"fuse_head_loss": False})
              for name in ("fasttransformer", "gpt2")]
    # Each attention grid's blocks back in the causal order, light first (GPT-2's explicit kernels: bf16, where the
    # option applies).
    cases += [case("fasttransformer -heavy-first", "fasttransformer", prec, {"attention_heavy_first": False})
              for prec in ("bf16", "tf32")]
    cases += [case("gpt2 -explicit-heavy-first", "gpt2", "bf16", {"explicit_heavy_first": False})]
    # The bf16 step's pieces switched off one at a time, as the tf32 and fp32 ones above: each kernel, all of
    # them, the graph (bf16, the precision of the engine's goals, was timed only with its options off before).
    for name, cfg in configs.items():
        ops = [cfg.norm] + (["attention"] if cfg.attn_impl == "sdpa" else []) + ["embedding", "cross_entropy", "adamw"]
        cases += [case(f"{name} -{op}", name, "bf16", {"use_kernels": {op: False}}) for op in ops]
        cases += [case(f"{name} no-kernels", name, "bf16", {"use_kernels": False}),
                  case(f"{name} uncaptured", name, "bf16", {"capture": False})]
    return cases


# (label suffix, engine options, the base cases it applies to, the precisions it applies in) of each option on
# trial; an option waiting for a trial goes here. Winners became defaults (ftlib.views.engine_config.TRIAL_WINNERS);
# losers stay options (chapter 6 keeps every trial's rows). Labels must not extend one another: a label that
# another extends is read as a default case.
CANDIDATES: tuple[tuple[str, dict[str, Any], tuple[str, ...], tuple[str, ...]], ...] = ()


def engine_candidates() -> list[Case]:
    """Engine options built but not yet measured, each beside the default engine it would change, both
    in the same run: per precision and model (GPT-2 also with the attention kernel), the default
    case, then one case per candidate option that applies to it; a default case no candidate applies
    to is left out. An option that wins becomes a default (its ablation then joins ``engine``); one
    that loses leaves this list. Rows go to their own file, so ``engine``'s keys and its table in
    chapter 6 stay as they are; chapter 6 shows these beside it (``ftlib.views.option_trials.candidate_table``).
    """
    configs = headline_models()
    bases = [("fasttransformer", "fasttransformer", {}), ("gpt2", "gpt2", {}),
             ("gpt2 +flash-attn", "gpt2", {"attention_for_explicit": True})]
    cases = []
    for prec in ("bf16", "tf32"):
        for label, name, base in bases:
            mine = [(suffix, extra) for suffix, extra, on, precs in CANDIDATES if label in on and prec in precs]
            if mine:
                cases += [Case(label + suffix, configs[name], HEADLINE_B, HEADLINE_T, "engine", prec,
                               {**base, **extra}) for suffix, extra in [("", {}), *mine]]
    return cases
