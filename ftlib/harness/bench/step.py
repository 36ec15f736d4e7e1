"""Benchmark of one training step: zero_grad + forward + loss + backward + optimizer step.

``bench_step`` measures one (config, B, T, mode, precision) and returns a tidy row;
``ftlib.harness.bench.cases`` runs many, resumably.

Modes:

* ``eager``       - plain PyTorch, ``ftlib.training.step.train_step``.
* ``cudagraph``   - the whole step (forward, backward, fused capturable AdamW) captured by
  hand in one ``torch.cuda.graph``, following PyTorch's "whole-network capture" recipe:
  warm up on a side stream, set grads to None, capture, then copy each batch into the
  static input buffers and replay.
* ``compile``     - ``torch.compile`` with its default mode.
* ``compile-ro``  - ``torch.compile(mode='reduce-overhead')`` (Inductor + CUDA graphs).
* ``compile-max`` - ``mode='max-autotune-no-cudagraphs'``; its compile can take many minutes,
  so sweeps run it in a subprocess with a time limit (``bench_step_isolated``).
* ``engine``      - ``ftlib.training.engine.Engine``: the kernels, flat parameter/grad buffers and flat
  AdamW, the whole step in one CUDA graph (uncaptured on CPU). It builds its own model and
  optimizer; a case's ``extra`` may carry engine options (``ftlib.training.engine.EngineOptions``,
  e.g. ``{"use_kernels": {"attention": False}}``), which then also enter the row's key.

Where the optimizer sits (``optimizer``) matters as much as the mode for a small model, whose
step is short enough that launching AdamW's kernels from Python is a visible share of it:

* ``default``    - ``torch.optim.AdamW`` as constructed by default (the multi-tensor "foreach"
  implementation on CUDA), run eagerly after the model; compile modes compile the model only.
* ``fused``      - AdamW with ``fused=True``: one CUDA kernel per parameter group, run eagerly.
* ``whole-step`` - compile modes only: forward, loss, backward and ``optimizer.step()`` in one
  compiled function, so Inductor also generates the optimizer's kernels (PyTorch's FAQ on
  training with ``torch.compile``: Dynamo captures the forward and ``optimizer.step()``; the
  backward comes from AOTAutograd).
* ``whole-step-ca`` - the same, with compiled autograd on: the backward is traced at run time into a
  graph of its own instead of being run by the eager autograd engine (PyTorch's "Compiled Autograd"
  tutorial). Where the step is short enough for the host to show, this is the compiler's fullest
  capture of it.

* ``graphed``    - modes ``compile`` and ``compile-max`` only: the compiled model's step (forward,
  backward, fused capturable AdamW) captured by hand in one ``torch.cuda.graph``, as the ``cudagraph``
  mode captures the eager step: the compiler's kernels, the update's one kernel, no host work between.

The manual ``cudagraph`` mode always uses the fused, capturable AdamW (capture needs it).

Timing follows the original: synthetic tokens, warm-up steps, then per-step CUDA events
(wall clock on CPU); median and spread over the measured steps. A pool of batches is made
on the device beforehand and rotated, so data changes but no host->device copy is timed.
Before timing, the mode's loss after its first update is compared with an eager run of
the same steps from the same initial weights (``check_ok``). Failures (OOM, compile
errors, time-outs, unsupported combinations) become rows with a ``status``, not crashes.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
import traceback
from collections.abc import Mapping
from typing import Any

import torch

from ftlib.core.device import device_slug, pick_device
from ftlib.core.precision import precision_region
from ftlib.core.timing import summarize_ms, sync, time_calls
from ftlib.harness.bench.runners import (
    COMPILE_MODES,
    GRAPH_WARMUP,
    STEP_MODES,
    WHOLE_STEP,
    autograd_context,
    captures_whole_step,
    check_optimizer,
    compile_counters,
    compile_report,
    engine_runner,
    fresh_compile_cache,
    make_runner,
    make_step_optimizer,
    shared_compile_cache,
)
from ftlib.harness.provenance import provenance
from ftlib.harness.results import row_key
from ftlib.model.config import PRESETS, ModelConfig, preset
from ftlib.model.gpt import build_model
from ftlib.training.data import synthetic_batch
from ftlib.training.step import grad_scaler, train_step

STATUSES = ("ok", "oom", "error", "timeout", "unsupported")
# Relative difference allowed between a mode's loss and eager's after the same update. Compiled
# kernels reorder float sums; TF32 and bf16 round the matmul inputs to 10 and 7 mantissa bits
# (unit roundoff 2^-11 ~ 5e-4 and 2^-8 ~ 4e-3), and the errors of a step's products add up.
CHECK_RTOL = {"fp32": 1e-3, "tf32": 1e-2, "bf16": 3e-2, "fp16": 3e-2}
ROW_FIELDS = (
    "key", "bench", "label", "preset", "config", "config_hash", "n_params",
    "B", "T", "tokens", "mode", "precision", "optimizer", "device_slug",
    "status", "error", "n_warmup", "n_iters", "timing",
    "median_ms", "p20_ms", "p80_ms", "min_ms", "max_ms", "mean_ms", "tokens_per_s",
    "first_step_s", "first_step_cache", "peak_mem_mb", "peak_reserved_mb",
    "check_ok", "check_loss", "ref_loss", "check_rel_err", "check_rtol", "check_note",
    "loss_first", "loss_last", "loss_finite", "isolated", "wall_s", "extra",
    "optimizer_kind", "compiled_graphs", "graph_breaks", "cudagraph_skips",
    # provenance (ftlib.harness.provenance.provenance), flattened so rows stay tidy
    "device", "device_type", "torch", "triton", "cuda", "python", "date", "commit", "machine_id", "run_id",
)


def preset_of(config: ModelConfig) -> str | None:
    """The preset name whose configuration equals ``config`` exactly, if any."""
    for name in PRESETS:
        if preset(name) == config:
            return name
    return None


def resolve_config(config: ModelConfig | str) -> tuple[ModelConfig, str | None]:
    if isinstance(config, str):
        return preset(config), config
    return config, preset_of(config)


def key_extra(optimizer: str, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"optimizer": optimizer, **(extra or {})}


def case_ident(row: Mapping[str, Any]) -> str:
    """What a row measured, whichever run measured it: its key with the run left out.

    Rows of different runs with equal idents are repeats of one measurement.
    """
    extra = {k: v for k, v in (row.get("extra") or {}).items() if k != "run"}
    return row_key(row["bench"], row["config_hash"], row["B"], row["T"], row["mode"], row["precision"],
                   key_extra(row.get("optimizer_kind") or "default", extra))


def _batch_pool(
    vocab_size: int, B: int, T: int, n: int, device: torch.device, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` synthetic batches already on the device, so the timed loop copies nothing from the host."""
    g = torch.Generator().manual_seed(seed)
    return [synthetic_batch(vocab_size, B, T, generator=g, device=device) for _ in range(n)]


def _reference_losses(cfg, seed, pool, n_steps, opt_kind, mode, device, precision: str = "fp32") -> list[float]:
    """Eager losses of steps 0..n_steps-1 from the same initial weights, batches and optimizer.

    The whole-step placement's reference is the default AdamW run eagerly (the same math).
    """
    model = build_model(cfg, seed=seed).to(device)
    opt, _ = make_step_optimizer(model, "default" if opt_kind in WHOLE_STEP else opt_kind, mode, device)
    scaler = grad_scaler(precision, device)
    losses = [train_step(model, opt, *pool[k % len(pool)], scaler=scaler).item() for k in range(n_steps)]
    del model, opt
    return losses


def base_row(
    bench: str, label: str, cfg: ModelConfig, preset_name: str | None, B: int, T: int, mode: str, prec: str,
    opt_kind: str, device: torch.device, extra: Mapping[str, Any] | None,
) -> dict[str, Any]:
    row: dict[str, Any] = {f: None for f in ROW_FIELDS}
    row.update(provenance(device))
    row.update(
        key=row_key(bench, cfg.config_hash(), B, T, mode, prec, key_extra(opt_kind, extra)),
        bench=bench, label=label or preset_name or cfg.config_hash(), preset=preset_name,
        config=cfg.to_dict(), config_hash=cfg.config_hash(), B=int(B), T=int(T), tokens=int(B * T),
        mode=mode, precision=prec, optimizer=opt_kind, device_slug=device_slug(device),
        status="ok", isolated=False, extra=dict(extra or {}), optimizer_kind=opt_kind,
        timing="cuda-events" if device.type == "cuda" else "perf-counter",
    )
    return row


def _classify(exc: BaseException) -> str:
    msg = str(exc).lower()
    # CUDA raises OutOfMemoryError; the CPU allocator a RuntimeError saying "can't allocate memory".
    if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in msg or "can't allocate memory" in msg:
        return "oom"
    return "error"


def bench_step(
    config: ModelConfig | str,
    B: int,
    T: int,
    mode: str = "eager",
    precision: str = "fp32",
    device: torch.device | str = "auto",
    warmup: int = 10,
    iters: int = 50,
    *,
    bench: str = "step",
    label: str | None = None,
    seed: int = 0,
    n_batches: int = 8,
    optimizer: str = "default",
    check: bool = True,
    cold_compile: bool = True,
    first_step_budget_s: float | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Measure one training step configuration; always returns a row (see ``ROW_FIELDS``).

    ``warmup`` counts steps after the mode's setup (including the first, compiling step
    and the check step); ``iters`` steps are then timed one by one. ``cold_compile`` runs
    compile modes with fresh, empty compile caches so ``first_step_s`` includes the whole
    compile; without it they use the machine's caches (faster when earlier cases built the
    same kernels), with Dynamo reset all the same. If ``first_step_budget_s`` is given and
    the first step took longer, the row is marked 'timeout' and the timing is skipped (the
    step itself cannot be interrupted in-process; use ``bench_step_isolated`` for a hard limit).
    """
    t_start = time.perf_counter()
    cfg, preset_name = resolve_config(config)
    prec = precision
    dev = pick_device(device) if isinstance(device, str) else torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if mode not in STEP_MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {STEP_MODES}")
    if mode != "engine":  # the engine brings its own optimizer (the flat AdamW)
        check_optimizer(mode, optimizer)
    if warmup < 0 or iters < 1:
        raise ValueError(f"warmup must be >= 0 and iters >= 1 (got warmup={warmup}, iters={iters})")
    row = base_row(bench, label, cfg, preset_name, B, T, mode, prec, optimizer, dev, extra)
    row.update(n_warmup=max(warmup, 2), n_iters=iters, check_rtol=CHECK_RTOL.get(prec))
    if captures_whole_step(mode, optimizer) and dev.type != "cuda":
        row.update(status="unsupported", error=f"{mode}, {optimizer}: a CUDA graph needs a CUDA device")
        row["wall_s"] = time.perf_counter() - t_start
        return row

    model = opt = runner = pool = engine = None
    compile_ctx = (
        (fresh_compile_cache() if cold_compile else shared_compile_cache()) if mode in COMPILE_MODES
        else contextlib.nullcontext()
    )
    try:
        cfg.check_sequence(T)
        # precision() opens autocast with its weight-cast cache off, so each step casts fresh weights.
        with precision_region(prec, dev), compile_ctx, autograd_context(optimizer if mode in COMPILE_MODES else ""):
            pool = _batch_pool(cfg.vocab_size, B, T, n_batches, dev, seed + 1)
            first_k = GRAPH_WARMUP if captures_whole_step(mode, optimizer) else 0
            check_k = first_k + 1  # the step after the mode's first update
            ref = None
            if check and mode != "eager" and cfg.dropout == 0:
                ref = _reference_losses(cfg, seed, pool, check_k + 1, optimizer, mode, dev, prec)
            if dev.type == "cuda":  # free the reference model so the peak is this mode's own
                gc.collect()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(dev)

            if mode != "engine":  # the engine builds its own model and optimizer, inside the first step
                model = build_model(cfg, seed=seed).to(dev)
                opt, row["optimizer"] = make_step_optimizer(model, optimizer, mode, dev)
                row["n_params"] = sum(p.numel() for p in model.parameters())

            # First step: compile (compile modes), side-stream warm-up + capture (cudagraph, engine).
            t0 = time.perf_counter()
            if mode == "engine":
                from ftlib.training.engine import Engine
                from ftlib.training.engine.options import option_names

                opts = {k: v for k, v in (extra or {}).items() if k in option_names()}
                engine = Engine(cfg, B, T, prec, dev, seed=seed, **opts)
                runner = engine_runner(engine, pool)
                row.update(optimizer=engine.optimizer.name, n_params=engine.num_params(), engine=engine.describe())
            else:
                if mode in COMPILE_MODES:  # before the runner: a graphed one compiles while it warms up
                    compile_counters().clear()
                runner = make_runner(mode, model, opt, pool, optimizer, grad_scaler(prec, dev))
            runner.prepare(first_k)
            loss_first = runner.run(first_k).item()  # .item() synchronizes
            row["first_step_s"] = time.perf_counter() - t0
            if mode in COMPILE_MODES:
                row.update(compile_report())
            # 'shared-dir': compiled against caches earlier cases may have filled, so not a cold compile.
            row["first_step_cache"] = (("fresh-dir" if cold_compile else "shared-dir") if mode in COMPILE_MODES
                                       else "process")
            row["loss_first"] = loss_first
            if first_step_budget_s is not None and row["first_step_s"] > first_step_budget_s:
                row.update(status="timeout",
                           error=f"first step took {row['first_step_s']:.1f} s > budget {first_step_budget_s} s")
                return row

            runner.prepare(check_k)
            check_loss = runner.run(check_k).item()
            row["check_loss"] = check_loss
            if ref is not None:
                rel = abs(check_loss - ref[check_k]) / max(abs(ref[check_k]), 1e-12)
                row.update(ref_loss=ref[check_k], check_rel_err=rel,
                           check_ok=bool(math.isfinite(check_loss) and rel <= CHECK_RTOL[prec]))
                row["check_note"] = f"loss at step {check_k} vs eager from the same weights and batches"
            else:
                row["check_ok"] = bool(math.isfinite(check_loss))
                row["check_note"] = (
                    "eager is the reference: finite loss only" if mode == "eager"
                    else "check off or dropout > 0 (random masks differ): finite loss only"
                )

            k = check_k + 1
            for _ in range(max(warmup, 2) - 2):
                runner.prepare(k)
                runner.run(k)
                k += 1
            sync(dev)

            times, loss = time_calls(runner.run, iters, dev, start=k, before=runner.prepare)
            loss_last = loss.item()
            row.update(summarize_ms(times))
            row["tokens_per_s"] = B * T / (row["median_ms"] / 1e3)
            row.update(loss_last=loss_last, loss_finite=bool(math.isfinite(loss_last)))
            if dev.type == "cuda":
                row["peak_mem_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
                row["peak_reserved_mb"] = torch.cuda.max_memory_reserved(dev) / 2**20
    except Exception as exc:  # any failure becomes a row, so a sweep keeps going
        row.update(status=_classify(exc), error=f"{type(exc).__name__}: {exc}"[:2000],
                   traceback=traceback.format_exc()[-3000:])
    finally:
        del model, opt, runner, pool, engine
        if dev.type == "cuda":  # graphs and compiled code hold memory via reference cycles
            gc.collect()
            with contextlib.suppress(Exception):
                torch.cuda.synchronize(dev)
                torch.cuda.empty_cache()
        row["wall_s"] = time.perf_counter() - t_start
    return row


