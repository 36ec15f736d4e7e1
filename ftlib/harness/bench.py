"""Benchmark of one training step: zero_grad + forward + loss + backward + optimizer step.

``bench_step`` measures one (config, B, T, mode, precision) and returns a tidy row;
``bench_sweep`` / ``bench_cases`` run many, skip what a :class:`ftlib.harness.results.ResultStore`
already holds and write each row as soon as it is measured, so a killed run resumes.

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
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ftlib.core.device import device_slug, pick_device
from ftlib.core.precision import precision_region
from ftlib.core.progress import progress_bar
from ftlib.core.repo import repo_root
from ftlib.harness.provenance import provenance
from ftlib.harness.results import ResultStore, row_key
from ftlib.model.config import PRESETS, ModelConfig, preset
from ftlib.model.gpt import build_model
from ftlib.training.data import synthetic_batch
from ftlib.training.step import grad_scaler, make_optimizer, train_step

MODES = ("eager", "cudagraph", "compile", "compile-ro", "compile-max", "engine")
COMPILE_MODES: dict[str, str | None] = {
    "compile": None,
    "compile-ro": "reduce-overhead",
    "compile-max": "max-autotune-no-cudagraphs",
}
OPTIMIZERS = ("default", "fused", "whole-step")
STATUSES = ("ok", "oom", "error", "timeout", "unsupported")
# Relative difference allowed between a mode's loss and eager's after the same update.
# Compiled kernels reorder float sums; TF32/bf16 round the matmul inputs (METHOD.md's
# error levels: fp32 far under 1e-3, tf32 ~3e-4 per product, bf16 1e-3..1e-2).
CHECK_RTOL = {"fp32": 1e-3, "tf32": 1e-2, "bf16": 3e-2, "fp16": 3e-2}
# Steps the cudagraph mode runs eagerly on a side stream before capture (PyTorch's recipe uses 3).
GRAPH_WARMUP = 3

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


def _resolve(config: ModelConfig | str) -> tuple[ModelConfig, str | None]:
    if isinstance(config, str):
        return preset(config), config
    return config, preset_of(config)


def _key_extra(optimizer: str, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"optimizer": optimizer, **(extra or {})}


def case_ident(row: Mapping[str, Any]) -> str:
    """What a row measured, whichever run measured it: its key with the run left out.

    Rows of different runs with equal idents are repeats of one measurement.
    """
    extra = {k: v for k, v in (row.get("extra") or {}).items() if k != "run"}
    return row_key(row["bench"], row["config_hash"], row["B"], row["T"], row["mode"], row["precision"],
                   _key_extra(row.get("optimizer_kind") or "default", extra))


def _percentile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), for q in [0, 1]."""
    pos = (len(sorted_xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summarize_ms(times_ms: Sequence[float]) -> dict[str, float]:
    """Median, p20, p80, min, max and mean of per-step times in milliseconds."""
    xs = sorted(times_ms)
    return {
        "median_ms": _percentile(xs, 0.5), "p20_ms": _percentile(xs, 0.2), "p80_ms": _percentile(xs, 0.8),
        "min_ms": xs[0], "max_ms": xs[-1], "mean_ms": sum(xs) / len(xs),
    }


@contextlib.contextmanager
def _fresh_compile_cache() -> Iterator[None]:
    """Cold compile in this process: reset Dynamo, empty Inductor/Triton cache dirs, no FX/AOT caches.

    The knobs are those of PyTorch's compile-caching recipe (TORCHINDUCTOR_CACHE_DIR,
    TORCHINDUCTOR_FX_GRAPH_CACHE, TORCHINDUCTOR_AUTOGRAD_CACHE), set here through the
    config objects and ``torch._inductor.utils.fresh_cache`` (a temporary cache dir for
    Inductor and Triton). Python imports and the CUDA context stay warm: for a
    whole-process cold start use ``bench_step_isolated``.
    """
    import torch._dynamo
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    import torch._inductor.utils as inductor_utils

    fresh = getattr(inductor_utils, "fresh_cache", None) or inductor_utils.fresh_inductor_cache
    torch._dynamo.reset()
    with contextlib.ExitStack() as stack:
        stack.enter_context(inductor_config.patch(fx_graph_cache=False))
        if hasattr(functorch_config, "enable_autograd_cache"):
            stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
        stack.enter_context(fresh())
        try:
            yield
        finally:
            torch._dynamo.reset()


@contextlib.contextmanager
def _shared_compile_cache() -> Iterator[None]:
    """Compile against this machine's Inductor/Triton caches (possibly warm), Dynamo reset around it.

    For sweeps whose compile time is not the measurement: kernels another case already built
    come from the cache. The resets matter: without them a new model of the same class
    recompiles on guard failures, Dynamo gives up and runs eager after a few recompiles
    (its recompile limit), and a changed shape makes it compile dynamic shapes. Either would
    silently change what a 'compile' row measures.
    """
    import torch._dynamo

    torch._dynamo.reset()
    try:
        yield
    finally:
        torch._dynamo.reset()


def _batch_pool(
    vocab_size: int, B: int, T: int, n: int, device: torch.device, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` synthetic batches already on the device, so the timed loop copies nothing from the host."""
    g = torch.Generator().manual_seed(seed)
    return [synthetic_batch(vocab_size, B, T, generator=g, device=device) for _ in range(n)]


def check_optimizer(mode: str, kind: str) -> None:
    """Refuse an optimizer placement the mode cannot have, with what to ask for instead."""
    if kind not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {kind!r}; expected one of {OPTIMIZERS}")
    if kind == "whole-step" and mode not in COMPILE_MODES:
        raise ValueError(f"optimizer='whole-step' compiles the step with torch.compile: it needs a compile mode "
                         f"({', '.join(COMPILE_MODES)}), not {mode!r}")


def _make_optimizer(model: torch.nn.Module, kind: str, mode: str, device: torch.device):
    check_optimizer(mode, kind)
    if mode == "cudagraph":
        # Capture needs the step count on the device (capturable); fused is one kernel per group.
        return make_optimizer(model, fused=True, capturable=True), "adamw-fused-capturable"
    if kind == "fused":
        return make_optimizer(model, fused=True), "adamw-fused"
    if kind == "whole-step":
        # The default AdamW, traced by Dynamo inside the compiled step (it keeps the step count
        # on the device itself, so the compiled step can also be CUDA-graphed).
        return make_optimizer(model), "adamw-compiled-in-step"
    return make_optimizer(model), "adamw-foreach" if device.type == "cuda" else "adamw-default"


@dataclass
class _Runner:
    """How a mode runs step k: ``prepare`` (untimed) then ``run`` (timed); ``first_k`` = first real step."""

    prepare: Callable[[int], None]
    run: Callable[[int], torch.Tensor]
    first_k: int = 0


def _eager_runner(model, opt, pool, scaler=None) -> _Runner:
    n = len(pool)
    return _Runner(lambda k: None, lambda k: train_step(model, opt, *pool[k % n], scaler=scaler))


def _forward_backward_update(model, opt, x, y) -> torch.Tensor:
    """The step without zero_grad: what ``optimizer='whole-step'`` compiles as one function.

    zero_grad stays outside: Dynamo does not trace ``Optimizer.zero_grad`` (a graph break),
    and setting grads to None costs nothing on the device.
    """
    _, loss = model(x, y)
    loss.backward()
    opt.step()
    return loss.detach()


def _compile_runner(model, opt, pool, mode: str, whole_step: bool = False, scaler=None) -> _Runner:
    n = len(pool)
    if whole_step and scaler is not None:
        # GradScaler's step reads its found-inf flag between the backward and the update; this
        # harness does not compile it into the step.
        raise NotImplementedError("optimizer='whole-step' with fp16 loss scaling is not measured: "
                                  "GradScaler is not compiled into the step here")
    if whole_step:
        body = torch.compile(_forward_backward_update, mode=COMPILE_MODES[mode])

        def step(k: int) -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            return body(model, opt, *pool[k % n])
    else:
        compiled = torch.compile(model, mode=COMPILE_MODES[mode])

        def step(k: int) -> torch.Tensor:
            return train_step(compiled, opt, *pool[k % n], scaler=scaler)
    if mode == "compile-ro":
        def run(k: int) -> torch.Tensor:
            # Tell CUDA-graph trees a new iteration starts, so last step's outputs may be overwritten.
            torch.compiler.cudagraph_mark_step_begin()
            return step(k)
        return _Runner(lambda k: None, run)
    return _Runner(lambda k: None, step)


def _cudagraph_runner(model, opt, pool, scaler=None) -> _Runner:
    """Whole-step capture, as in PyTorch's CUDA-graphs notes ("whole-network capture")."""
    n = len(pool)
    static_x, static_y = pool[0][0].clone(), pool[0][1].clone()

    def prepare(k: int) -> None:
        static_x.copy_(pool[k % n][0])
        static_y.copy_(pool[k % n][1])

    # Warm up on a side stream so lazy initializations (cuBLAS handles, optimizer state,
    # autograd's stream bookkeeping) happen outside the capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for k in range(GRAPH_WARMUP):  # with a scaler, this also creates its state tensors
            prepare(k)
            train_step(model, opt, static_x, static_y, scaler=scaler)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    # Grads set to None before capture: backward inside the capture allocates .grad from
    # the graph's private pool and every replay overwrites them in place, which is what
    # zero_grad(set_to_none=True) + backward does in eager mode. No zero_grad inside.
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        _, static_loss = model(static_x, static_y)
        if scaler is None:
            static_loss.backward()
            opt.step()
        else:  # the fused AdamW takes the scaler's found-inf on the device: nothing syncs
            scaler.scale(static_loss).backward()
            scaler.step(opt)
            scaler.update()
    loss_out = static_loss.detach()

    def run(k: int) -> torch.Tensor:
        graph.replay()
        return loss_out

    # Keep the graph alive as long as the runner (the closure holds it).
    return _Runner(prepare, run, first_k=GRAPH_WARMUP)


def _engine_runner(engine, pool) -> _Runner:
    """Like the cudagraph mode: copy the batch into the engine's static buffers untimed, replay timed."""
    n = len(pool)

    def prepare(k: int) -> None:
        engine.static_x.copy_(pool[k % n][0])
        engine.static_y.copy_(pool[k % n][1])

    # Handing the engine its own static buffers makes its copies no-ops (copy_ of a tensor onto itself).
    return _Runner(prepare, lambda k: engine.step(engine.static_x, engine.static_y))


def _make_runner(mode: str, model, opt, pool, optimizer: str = "default", scaler=None) -> _Runner:
    if mode == "eager":
        return _eager_runner(model, opt, pool, scaler)
    if mode == "cudagraph":
        return _cudagraph_runner(model, opt, pool, scaler)
    return _compile_runner(model, opt, pool, mode, whole_step=optimizer == "whole-step", scaler=scaler)


def _reference_losses(cfg, seed, pool, n_steps, opt_kind, mode, device, precision: str = "fp32") -> list[float]:
    """Eager losses of steps 0..n_steps-1 from the same initial weights, batches and optimizer.

    The whole-step placement's reference is the default AdamW run eagerly (the same math).
    """
    model = build_model(cfg, seed=seed).to(device)
    opt, _ = _make_optimizer(model, "default" if opt_kind == "whole-step" else opt_kind, mode, device)
    scaler = grad_scaler(precision, device)
    losses = [train_step(model, opt, *pool[k % len(pool)], scaler=scaler).item() for k in range(n_steps)]
    del model, opt
    return losses


def _compile_counters():
    import torch._dynamo.utils

    return torch._dynamo.utils.counters


def _compile_report() -> dict[str, int]:
    """What the compiler made of the step: graphs compiled, graph breaks, graphs left out of CUDA graphs.

    A reduce-overhead row whose graphs were skipped by CUDA-graph trees launches from Python
    like the default mode: the count says so next to the time.
    """
    c = _compile_counters()
    return {"compiled_graphs": int(c["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(c["graph_break"].values())),
            "cudagraph_skips": int(c["inductor"].get("cudagraph_skips", 0))}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_steps(runner: _Runner, start_k: int, iters: int, device: torch.device):
    """Per-step times in ms (CUDA events on GPU, perf_counter on CPU) and the last loss."""
    times: list[float] = []
    loss = None
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for i in range(iters):
            runner.prepare(start_k + i)
            starts[i].record()
            loss = runner.run(start_k + i)
            ends[i].record()
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    else:
        for i in range(iters):
            runner.prepare(start_k + i)
            t0 = time.perf_counter()
            loss = runner.run(start_k + i)
            times.append((time.perf_counter() - t0) * 1e3)
    return times, loss


def _base_row(
    bench, label, cfg, preset_name, B, T, mode, prec, opt_kind, device, extra
) -> dict[str, Any]:
    row: dict[str, Any] = {f: None for f in ROW_FIELDS}
    row.update(provenance(device))
    row.update(
        key=row_key(bench, cfg.config_hash(), B, T, mode, prec, _key_extra(opt_kind, extra)),
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
    cfg, preset_name = _resolve(config)
    prec = precision
    dev = pick_device(device) if isinstance(device, str) else torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if mode != "engine":  # the engine brings its own optimizer (the flat AdamW)
        check_optimizer(mode, optimizer)
    if warmup < 0 or iters < 1:
        raise ValueError(f"warmup must be >= 0 and iters >= 1 (got warmup={warmup}, iters={iters})")
    row = _base_row(bench, label, cfg, preset_name, B, T, mode, prec, optimizer, dev, extra)
    row.update(n_warmup=max(warmup, 2), n_iters=iters, check_rtol=CHECK_RTOL.get(prec))
    if mode == "cudagraph" and dev.type != "cuda":
        row.update(status="unsupported", error="cudagraph mode needs a CUDA device")
        row["wall_s"] = time.perf_counter() - t_start
        return row

    model = opt = runner = pool = engine = None
    compile_ctx = (
        (_fresh_compile_cache() if cold_compile else _shared_compile_cache()) if mode in COMPILE_MODES
        else contextlib.nullcontext()
    )
    try:
        cfg.check_sequence(T)
        # precision() opens autocast with its weight-cast cache off, so each step casts fresh weights.
        with precision_region(prec, dev), compile_ctx:
            pool = _batch_pool(cfg.vocab_size, B, T, n_batches, dev, seed + 1)
            first_k = GRAPH_WARMUP if mode == "cudagraph" else 0
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
                opt, row["optimizer"] = _make_optimizer(model, optimizer, mode, dev)
                row["n_params"] = sum(p.numel() for p in model.parameters())

            # First step: compile (compile modes), side-stream warm-up + capture (cudagraph, engine).
            t0 = time.perf_counter()
            if mode == "engine":
                from ftlib.training.engine import Engine
                from ftlib.training.engine.options import option_names

                opts = {k: v for k, v in (extra or {}).items() if k in option_names()}
                engine = Engine(cfg, B, T, prec, dev, seed=seed, **opts)
                runner = _engine_runner(engine, pool)
                row.update(optimizer=engine.optimizer.name, n_params=engine.num_params(), engine=engine.describe())
            else:
                runner = _make_runner(mode, model, opt, pool, optimizer, grad_scaler(prec, dev))
            if mode in COMPILE_MODES:
                _compile_counters().clear()
            runner.prepare(first_k)
            loss_first = runner.run(first_k).item()  # .item() synchronizes
            row["first_step_s"] = time.perf_counter() - t0
            if mode in COMPILE_MODES:
                row.update(_compile_report())
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
            _sync(dev)

            times, loss = _time_steps(runner, k, iters, dev)
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


# ---------------------------------------------------------------------------------------
# A whole-process cold start, with a hard time limit: the same measurement in a subprocess.


def cold_cache_env(cache_dir: str | Path) -> dict[str, str]:
    """Environment for a process whose compile caches are empty and whose FX/AOT caches are off."""
    env = dict(os.environ)
    root = str(repo_root())
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(
        TORCHINDUCTOR_CACHE_DIR=str(cache_dir),
        TRITON_CACHE_DIR=str(Path(cache_dir) / "triton"),
        TORCHINDUCTOR_FX_GRAPH_CACHE="0",
        TORCHINDUCTOR_AUTOGRAD_CACHE="0",
    )
    return env


def bench_step_isolated(
    config: ModelConfig | str,
    B: int,
    T: int,
    mode: str = "eager",
    precision: str = "fp32",
    device: torch.device | str = "auto",
    timeout_s: float = 600.0,
    **kwargs: Any,
) -> dict[str, Any]:
    """``bench_step`` in a fresh Python process with empty compile caches, killed after ``timeout_s``.

    ``first_step_s`` then is a true cold start of the compile (imports and CUDA context
    excluded: they happen before the first step). A time-out or a crash of the child
    (segfault, sticky CUDA error) becomes a row with status 'timeout' / 'error'.
    """
    cfg, preset_name = _resolve(config)
    dev = pick_device(device) if isinstance(device, str) else torch.device(device)
    spec = dict(config=cfg.to_dict(), B=B, T=T, mode=mode, precision=precision, device=str(dev), **kwargs)
    spec.setdefault("label", preset_name)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ftlib-bench-") as tmp:
        spec_path, out_path, log_path = (Path(tmp) / n for n in ("spec.json", "row.json", "log.txt"))
        spec_path.write_text(json.dumps(spec))
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ftlib.harness.bench", str(spec_path), str(out_path)],
                env=cold_cache_env(Path(tmp) / "cache"), stdout=log, stderr=subprocess.STDOUT,
                cwd=str(repo_root()), start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                # Its own session: kill the child and the compile workers it started.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
        if out_path.exists():
            row = json.loads(out_path.read_text())
        else:
            extra = kwargs.get("extra")
            row = _base_row(kwargs.get("bench", "step"), spec["label"], cfg, preset_name, B, T, mode,
                            precision, kwargs.get("optimizer", "default"), dev, extra)
            tail = log_path.read_text(errors="replace")[-2000:]
            if rc is None:
                row.update(status="timeout", error=f"no result within {timeout_s:g} s (whole process)",
                           traceback=tail)
            else:
                row.update(status="error", error=f"benchmark process exited with code {rc}", traceback=tail)
    row.update(isolated=True, timeout_s=timeout_s, wall_s=time.perf_counter() - t0)
    if row.get("status") == "ok":
        row["first_step_cache"] = "cold-process"
    return row


def _child_main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    cfg = ModelConfig(**spec.pop("config"))
    row = bench_step(cfg, **spec)
    Path(out_path).write_text(json.dumps(row, default=str))


# ---------------------------------------------------------------------------------------
# Sweeps: resumable, one row written per measurement.


@dataclass(frozen=True)
class Case:
    """One measurement to make: a labelled config at (B, T) in a mode and precision, with the
    optimizer placed as ``optimizer`` says (see the module docstring)."""

    label: str
    config: ModelConfig
    B: int
    T: int
    mode: str
    precision: str
    extra: dict = field(default_factory=dict, hash=False)
    optimizer: str = "default"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"case {self.label!r}: unknown mode {self.mode!r}; expected one of {MODES}")
        if self.mode != "engine":
            check_optimizer(self.mode, self.optimizer)

    def key(self, bench: str) -> str:
        return row_key(bench, self.config.config_hash(), self.B, self.T, self.mode, self.precision,
                       _key_extra(self.optimizer, self.extra))

    def ident(self, bench: str) -> str:
        """:func:`case_ident` of the row this case writes (its key without the run)."""
        return case_ident({"bench": bench, "config_hash": self.config.config_hash(), "B": self.B, "T": self.T,
                           "mode": self.mode, "precision": self.precision, "optimizer_kind": self.optimizer,
                           "extra": self.extra})


def make_cases(
    configs: Mapping[str, ModelConfig | str] | Sequence[ModelConfig | str],
    shapes: Iterable[tuple[int, int]],
    modes: Iterable[str],
    precisions: Iterable[str],
) -> list[Case]:
    """The product configs x shapes x precisions x modes, in that nesting order."""
    if isinstance(configs, Mapping):
        named = [(lbl, _resolve(c)[0]) for lbl, c in configs.items()]
    else:
        named = [(c if isinstance(c, str) else (preset_of(c) or c.config_hash()), _resolve(c)[0])
                 for c in configs]
    shapes, modes, precisions = list(shapes), list(modes), list(precisions)
    return [Case(lbl, cfg, B, T, m, p) for lbl, cfg in named for B, T in shapes for p in precisions
            for m in modes]


# Rough seconds a case takes when nothing is known yet (compile dominates), for budgeting.
DEFAULT_COST_S = {"eager": 10.0, "cudagraph": 15.0, "compile": 60.0, "compile-ro": 60.0, "compile-max": 120.0,
                  "engine": 20.0}


def bench_cases(
    cases: Iterable[Case],
    store: ResultStore,
    progress: bool = True,
    *,
    device: torch.device | str = "auto",
    isolate_modes: Iterable[str] = ("compile-max",),
    timeout_s: float = 600.0,
    retry_status: Iterable[str] = ("error",),
    deadline: float | None = None,
    on_row: Callable[[dict], None] | None = None,
    **bench_kwargs: Any,
) -> list[dict]:
    """Measure each case whose key the store lacks; append each row as soon as it exists.

    ``retry_status``: rows with these statuses are measured again (the new row supersedes
    the old). ``deadline`` (a ``time.monotonic()`` value): no new case starts when the time
    left is under its expected cost; isolated cases get at most the time left.
    """
    cases, isolate, retry = list(cases), set(isolate_modes), tuple(retry_status)
    if "optimizer" in bench_kwargs:
        raise ValueError("bench_cases takes each case's optimizer from Case.optimizer, not a keyword")
    todo = [c for c in cases if not store.has(c.key(store.bench), skip_status=retry)]
    cost = dict(DEFAULT_COST_S)
    rows: list[dict] = []
    bar = progress_bar(todo, progress, desc=store.bench, unit="case")
    for case in bar:
        bar.set_postfix_str(f"{case.label} B={case.B} T={case.T} {case.mode} {case.precision}")
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left < cost.get(case.mode, 60.0):
            bar.write(f"[{store.bench}] budget: {left:.0f} s left; stopping before {len(todo) - len(rows)} cases")
            break
        kw = dict(bench=store.bench, label=case.label, extra=case.extra or None, optimizer=case.optimizer,
                  **bench_kwargs)
        if case.mode in isolate:
            limit = timeout_s if left is None else max(1.0, min(timeout_s, left))
            row = bench_step_isolated(case.config, case.B, case.T, case.mode, case.precision, device,
                                      timeout_s=limit, **kw)
        else:
            row = bench_step(case.config, case.B, case.T, case.mode, case.precision, device, **kw)
        if row.get("wall_s"):
            cost[case.mode] = max(row["wall_s"], 1.0)  # the last case of a mode predicts the next
        store.append(row)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    bar.close()
    return rows


def bench_sweep(
    configs: Mapping[str, ModelConfig | str] | Sequence[ModelConfig | str],
    shapes: Iterable[tuple[int, int]],
    modes: Iterable[str],
    precisions: Iterable[str],
    store: ResultStore | None = None,
    progress: bool = True,
    *,
    bench: str = "step",
    device: torch.device | str = "auto",
    **kwargs: Any,
) -> list[dict]:
    """``bench_cases`` over configs x shapes x precisions x modes; returns the rows measured now.

    Without a ``store``, rows go to ``ResultStore(bench, device_slug(device))``.
    """
    dev = pick_device(device) if isinstance(device, str) else torch.device(device)
    store = store if store is not None else ResultStore(bench, device_slug(dev))
    return bench_cases(make_cases(configs, shapes, modes, precisions), store, progress, device=dev, **kwargs)


if __name__ == "__main__":  # the child of bench_step_isolated
    _child_main(sys.argv[1], sys.argv[2])
