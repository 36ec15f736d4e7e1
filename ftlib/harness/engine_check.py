"""The engine against reference training, step by step: the check that it computes what
``train_step`` + ``torch.optim.AdamW`` compute, and the GPU suite that stores it.

``check_against_reference`` trains an engine and the reference side by side from the same
weights on the same batches and compares the losses step by step and the weights at the end.
``run_engine_checks`` is the GPU runner's ``engine_check`` suite: 100 steps at B=32, T=256 for both
presets in fp32, tf32 and bf16 (and GPT-2 with the attention kernel in place of its explicit
softmax), one row per check in ``engine_check.jsonl``, keyed by the run.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ftlib.core.device import device_slug, pick_device
from ftlib.core.precision import precision_region
from ftlib.harness.bench.step import CHECK_RTOL
from ftlib.harness.provenance import provenance, run_id
from ftlib.harness.results import ResultStore, row_key
from ftlib.model.config import ModelConfig, preset
from ftlib.model.gpt import build_model
from ftlib.training.engine import Engine
from ftlib.training.step import grad_scaler, make_optimizer, train_step

BENCH = "engine_check"
STEPS, B_CHECK, T_CHECK = 100, 32, 256
# Where an option that changes the order of sums is checked: both models in bf16, the FastTransformer in tf32.
_OPTION_CASES = (("bf16", "fasttransformer"), ("bf16", "gpt2"), ("tf32", "fasttransformer"))
# (precision, preset, engine options) in the order the suite runs them.
CHECKS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    *((prec, name, {}) for prec in ("fp32", "tf32", "bf16") for name in ("gpt2", "fasttransformer")),
    *((prec, "gpt2", {"attention_for_explicit": True}) for prec in ("tf32", "bf16")),
    ("bf16", "fasttransformer", {"norm_dw_partials": "persistent"}),
    # grad_into_buffer (under bf16 the weight gradients accumulate in fp32 instead of being rounded to
    # bf16 first), fuse_kv_split_sum and norm_dw_into_buffer (the norms' weight gradients added
    # atomically, in no fixed order) and fuse_softmax_matmuls (GPT-2's explicit attention with the products
    # fused around its softmax) are defaults: the default checks above train with them.
    # The norm backward on another grid (the atomic adds in another order).
    *((prec, name, {"norm_bwd_grid": "8 rows 4/SM"}) for prec, name in (("bf16", "fasttransformer"),
                                                                       ("bf16", "gpt2"))),
    # The MLPs' GELU in the GEMM epilogues (GELU of z as stored in bf16, as unfused).
    *(("bf16", name, {"fuse_mlp_act": True}) for name in ("fasttransformer", "gpt2")),
    *(("tf32", name, {"fuse_mlp_act": True}) for name in ("fasttransformer", "gpt2")),
    # MQA's dK/dV partial sums grouped otherwise (the same gradients, summed in another order).
    *(("bf16", "fasttransformer", {"attention_kv_split": n}) for n in (8, 2)),
    # GPT-2's bias options (its bias gradients added into the flat gradient in no fixed order, its biased
    # Linears on the bf16 shadow, its projections' bias gradients summed from dr in fp32 before its bf16
    # rounding), the first norm's gradients added atomically, GPT-2's dQ kernel in one pass over each row
    # (the same sums in another order) and its up-projection's bias gradient summed by GELU's backward (from dz
    # as stored) are defaults: the default checks train with them.
    # GPT-2's qkv bias gradient summed by its attention's backward kernels (from dq, dk, dv as stored).
    *((prec, "gpt2", {"qkv_bias_into_attention": True}) for prec in ("tf32", "bf16")),
    # The weight-gradient GEMMs on a second stream (bf16) and the attention backward's two kernels side by side
    # (D formed by the dK/dV kernel too) are defaults: the default checks above train with them.
    # The head and the loss fused (fp32 logits in registers where the unfused bf16 step rounds them to bf16); a
    # default under bf16 now, so the default bf16 checks train with it too.
    *(("bf16", name, {"fuse_head_loss": True}) for name in ("fasttransformer", "gpt2")),
    # The norm backward's loop pipelined (the same tiles, the same atomic adds, in another timing).
    *(("bf16", name, {"norm_bwd_grid": "8 rows 4/SM s2"}) for name in ("fasttransformer", "gpt2")),
    # The embeddings' sum in one kernel, both tables' gradients added atomically (the same sums in another order);
    # a default now, so the default checks above train with it too.
    *((prec, name, {"fuse_embedding": True}) for prec, name in _OPTION_CASES),
    # The gradient kernels' atomic adds in relaxed memory order (the same adds, unordered against the program's
    # other memory operations): alone, then with the fused head and with the split-K weight gradients; a default
    # now, so the default checks above and the fused head's train with it too.
    *((prec, name, {"relaxed_atomics": True}) for prec, name in _OPTION_CASES),
    *(("bf16", name, {"fuse_head_loss": True, "relaxed_atomics": True}) for name in ("fasttransformer", "gpt2")),
    *(("bf16", name, {"wgrad_splitk": True, "relaxed_atomics": True}) for name in ("fasttransformer", "gpt2")),
    # The query heads of MQA's one K/V head packed into each tile of the attention's forward and dQ kernels (the
    # same sums per row, the rows in other places of the tile).
    *((prec, "fasttransformer", {"attention_pack_heads": True}) for prec in ("bf16", "tf32")),
    # Each attention grid's heaviest causal block launched first (the same programs and sums in another order); a
    # default now (GPT-2's under bf16), so the default checks above train with it too.
    *((prec, "fasttransformer", {"attention_heavy_first": True}) for prec in ("bf16", "tf32")),
    ("bf16", "gpt2", {"explicit_heavy_first": True}),  # bf16 only: in tf32 the option does not apply
    # The kernels launched with programmatic dependent launch (the same kernels, each waiting on the GPU for the last).
    *((prec, name, {"programmatic_launch": True}) for prec in ("bf16", "tf32") for name in ("fasttransformer", "gpt2")),
    # The same with no early signal (the next kernel let start only as each one's programs end).
    *(("bf16", name, {"programmatic_launch": True, "programmatic_trigger": "exit"})
      for name in ("fasttransformer", "gpt2")),
)


def pattern_batches(
    vocab_size: int, B: int, T: int, n: int, seed: int = 0, device: torch.device | str = "cpu"
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` batches of learnable sequences: row r is a_r + b_r * t (mod V), targets shifted by one.

    Unlike uniform random tokens the loss falls (the next token follows from the previous
    two, which needs attention), so a wrong gradient anywhere shows in the losses.
    """
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(T + 1)
    out = []
    for _ in range(n):
        a = torch.randint(vocab_size, (B, 1), generator=g)
        b = torch.randint(1, max(2, min(8, vocab_size)), (B, 1), generator=g)
        seq = (a + b * t) % vocab_size  # (B, T + 1)
        out.append((seq[:, :-1].contiguous().to(device), seq[:, 1:].contiguous().to(device)))
    return out


def check_against_reference(
    config: ModelConfig | str,
    steps: int = 100,
    device: torch.device | str = "auto",
    precision: str = "fp32",
    B: int = 32,
    T: int = 256,
    use_kernels: bool | Mapping[str, bool] = True,
    seed: int = 0,
    rtol: float | None = None,
    **engine_kwargs: Any,
) -> dict[str, Any]:
    """Train an Engine and the reference (``train_step`` + ``torch.optim.AdamW``, same groups)
    ``steps`` steps from the same initial weights on the same batches; compare.

    Returns a dict: both loss curves, ``max_rel_err`` (largest |engine - ref| / |ref| over
    the steps), ``param_rel_err`` (||w_engine - w_ref|| / ||w_ref|| over all weights at the
    end), ``ok`` (max_rel_err <= rtol and all losses finite; rtol defaults to
    ``ftlib.harness.bench.step.CHECK_RTOL[precision]``), and the engine's ``describe()``.
    """
    cfg = preset(config) if isinstance(config, str) else config
    dev = pick_device(device) if isinstance(device, str) else torch.device(device)
    lr = engine_kwargs.get("lr", 3e-4)
    betas = engine_kwargs.get("betas", (0.9, 0.999))
    wd = engine_kwargs.get("weight_decay", 0.01)
    batches = pattern_batches(cfg.vocab_size, B, T, steps, seed=seed + 1, device=dev)

    ref = build_model(cfg, seed=seed).to(dev)
    opt = make_optimizer(ref, lr=lr, betas=betas, weight_decay=wd)  # param_groups 'matrices'
    scaler = grad_scaler(precision, dev, engine_kwargs.get("loss_scale"))  # fp16: torch's GradScaler
    clip = engine_kwargs.get("grad_clip")
    ref_losses = []
    with precision_region(precision, dev):
        for x, y in batches:
            ref_losses.append(train_step(ref, opt, x, y, grad_clip=clip, scaler=scaler).clone())  # no sync per step

    engine = Engine(cfg, B, T, precision, dev, use_kernels=use_kernels, seed=seed, **engine_kwargs)
    eng_losses = [engine.step(x, y).clone() for x, y in batches]  # clone: the graph reuses its output

    ref_l = torch.stack(ref_losses).double().cpu().tolist()
    eng_l = torch.stack(eng_losses).double().cpu().tolist()
    rel = [abs(e - r) / max(abs(r), 1e-12) for e, r in zip(eng_l, ref_l)]
    ref_params = dict(ref.named_parameters())
    num = den = 0.0
    with torch.no_grad():
        for name, p in engine.model.named_parameters():
            r = ref_params[name].double()
            num += float((p.double() - r).pow(2).sum())
            den += float(r.pow(2).sum())
    tol = CHECK_RTOL[precision] if rtol is None else rtol
    finite = all(math.isfinite(v) for v in eng_l + ref_l)
    return {
        "steps": steps, "B": B, "T": T, "precision": precision,
        "losses_engine": eng_l, "losses_ref": ref_l,
        "max_rel_err": max(rel), "rel_err_last": rel[-1],
        "param_rel_err": math.sqrt(num / max(den, 1e-300)),
        "rtol": tol, "ok": bool(finite and max(rel) <= tol),
        "loss_drop_ref": ref_l[0] - ref_l[-1],
        "loss_scale_ref": scaler.get_scale() if scaler is not None else None,
        "loss_scale_engine": (engine.loss_scale_state() or {}).get("scale"),
        **engine.describe(),
    }


def check_key(name: str, precision: str, options: Mapping[str, Any], run: str, steps: int = STEPS) -> str:
    """The result key of one check of one run."""
    return row_key(BENCH, preset(name).config_hash(), B_CHECK, T_CHECK, "engine", precision,
                   {"steps": steps, "run": run, **options})


def run_engine_checks(device: torch.device, deadline: float, log: Callable[[str], None] = print) -> int:
    """Every check of :data:`CHECKS` at B=32, T=256 over 100 steps, one row each (a failure is a row
    too); stops starting checks 30 s before ``deadline`` (a ``time.monotonic()`` value). Returns the
    number of rows written."""
    store = ResultStore(BENCH, device_slug(device))
    written = 0
    for prec, name, options in CHECKS:
        if time.monotonic() > deadline - 30:
            log("[engine_check] budget spent")
            break
        cfg = preset(name)
        extra = {"steps": STEPS, "run": run_id(), **options}
        label = name + (" +flash-attn" if options.get("attention_for_explicit") else "") + "".join(
            f" {k}={v}" for k, v in options.items() if k != "attention_for_explicit")
        row = {"key": check_key(name, prec, options, run_id()), "bench": BENCH, "label": label, "preset": name,
               "config": cfg.to_dict(), "config_hash": cfg.config_hash(), "B": B_CHECK, "T": T_CHECK,
               "mode": "engine", "precision": prec, "extra": extra, **provenance(device)}
        t0 = time.perf_counter()
        try:
            r = check_against_reference(cfg, STEPS, device, prec, B_CHECK, T_CHECK, **options)
            row.update(status="ok", check_ok=r["ok"], **r)
        except Exception as e:  # a failure is a row, so the other checks still run
            row.update(status="error", check_ok=False, error=f"{type(e).__name__}: {e}"[:2000],
                       traceback=traceback.format_exc()[-3000:])
        row["wall_s"] = time.perf_counter() - t0
        store.append(row)
        written += 1
        log(f"  engine_check {label:<28} {prec:<5} {row['status']:<6} ok {row.get('check_ok')} "
            f"max rel err {row.get('max_rel_err')} param rel err {row.get('param_rel_err')} "
            f"loss {row.get('losses_ref', [None])[0]} -> {row.get('losses_ref', [None])[-1]} "
            f"kernels {row.get('kernels')} {row.get('error', '')[:160]}")
    return written
