"""Measured profiles of one training step: where the device time goes, by phase and kernel.

The timed region is the original benchmark's: zero_grad(set_to_none) + forward + loss +
backward + AdamW step. :func:`profile_step` runs it under ``torch.profiler`` and reads the Chrome
trace it exports (:mod:`ftlib.harness.trace`: phases, kernel categories, launch gaps, the SDPA
backend).

Modes, named as in :mod:`ftlib.harness.bench.step`: ``eager``; ``compile`` (``torch.compile`` default);
``compile-ro`` (``torch.compile(mode='reduce-overhead')``: Inductor plus CUDA-graph trees,
one graph for the forward and one for the backward, so the ranges still separate them);
``cudagraph`` (the whole eager step, with fused capturable AdamW as in ``ftlib.harness.bench.step``,
captured in one ``torch.cuda.CUDAGraph``). Inside one whole-step graph
there is one launch for every kernel, so ranges cannot split it. Instead three graphs are
captured -- forward only, forward + backward, the full step -- and replayed under CUDA
events: forward = t(fwd), backward = t(fwd+bwd) - t(fwd), optimizer = t(step) - t(fwd+bwd).
Those are measured, not fractions. When the profiler also sees the replayed kernels, the
full step's kernel sequence is split at the lengths of the two shorter graphs' sequences,
but only if its prefixes match them name for name.

On CPU the same path runs on CPU ops (:mod:`ftlib.harness.trace`), which keeps it testable in CI
at tiny sizes.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, record_function

from ftlib.core.device import device_slug, pick_device
from ftlib.core.precision import Precision
from ftlib.core.timing import sync, time_once
from ftlib.harness.provenance import provenance
from ftlib.harness.trace import (
    GRAPH_REF,
    PHASE_PREFIX,
    STEP_RANGE,
    KernelRow,
    aggregate,
    parse_trace,
    sdpa_backend_from_ops,
    split_graph_step,
)
from ftlib.model.config import ModelConfig, preset
from ftlib.model.gpt import build_model
from ftlib.training.data import synthetic_batch
from ftlib.training.step import make_optimizer

BENCH = "profile"
PROFILE_MODES = ("eager", "cudagraph", "compile", "compile-ro")  # named as the step benchmark names them


# --------------------------------------------------------------------------- the profile

@dataclass
class Profile:
    """One measured profile of the training step; times are per step (mean over steps)."""

    preset: str | None
    config: dict[str, Any]
    B: int
    T: int
    precision: str
    mode: str
    device_slug: str
    steps: int
    step_ms: float  # median, unprofiled loop (CUDA events; wall time on CPU)
    step_ms_profiled: float  # mean of the profiled steps (the kernel rows are means too)
    busy_us: float | None  # union of busy device intervals; None if no kernel was traced
    gaps_us: float | None  # launch gaps: step time - busy
    phase_us: dict[str, float]  # device time per phase from the trace
    phase_source: str  # 'trace', 'graph-prefix' or 'none'
    graph_phase_us: dict[str, float] | None  # cudagraph mode: three-graph differences
    kernels: list[KernelRow]
    sdpa_backend: str
    kernels_per_step: float
    launches_per_step: float
    notes: list[str]
    provenance: dict[str, str]
    optimizer: str = ""

    @property
    def key(self) -> str:
        return profile_key(ModelConfig(**self.config), self.B, self.T, self.precision, self.mode, self.preset)

    def category_us(self) -> dict[tuple[str, str], float]:
        """(phase, category) -> time per step."""
        out: dict[tuple[str, str], float] = defaultdict(float)
        for k in self.kernels:
            out[(k.phase, k.category)] += k.total_us
        return dict(out)


def profile_key(
    config: ModelConfig, B: int, T: int, precision: str, mode: str, preset_name: str | None = None
) -> str:
    """The results key of a profile: what was measured, not how many steps it took."""
    from ftlib.harness.results import row_key

    return row_key(BENCH, config.config_hash(), B, T, mode, precision, {"preset": preset_name})


def _resolve(config: ModelConfig | str) -> tuple[ModelConfig, str | None]:
    return (preset(config), config) if isinstance(config, str) else (config, None)


def _trace_events(prof: torch.profiler.profile) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())["traceEvents"]


def _autocast(dev: torch.device, dtype: torch.dtype | None, cache: bool = True):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(dev.type, dtype=dtype, cache_enabled=cache)


def _marked_step(model, opt, x, y, mode: str, dtype: torch.dtype | None) -> Callable[[], torch.Tensor]:
    """``ftlib.training.step.train_step`` (grad_clip=None) with a profiler range around each phase."""
    dev = x.device

    def step() -> torch.Tensor:
        if mode == "compile-ro":
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration for CUDA-graph trees
        opt.zero_grad(set_to_none=True)
        with record_function(PHASE_PREFIX + "forward"), _autocast(dev, dtype):
            _, loss = model(x, y)
        with record_function(PHASE_PREFIX + "backward"):
            loss.backward()
        with record_function(PHASE_PREFIX + "optimizer"):
            opt.step()
        return loss.detach()
    return step


def _activities(dev: torch.device) -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])


def profile_step(
    config: ModelConfig | str,
    B: int,
    T: int,
    precision: str = "fp32",
    mode: str = "eager",
    device: torch.device | str = "auto",
    steps: int = 5,
    warmup: int = 3,
    timing_steps: int = 20,
    seed: int = 0,
    init_cupti_for_graphs: bool = True,
) -> Profile:
    """Profile the training step of ``config`` at batch ``B`` x ``T`` tokens.

    ``warmup`` steps (compilation, CUDA-graph recording, allocator warm-up) run first;
    ``timing_steps`` unprofiled steps give ``step_ms``; ``steps`` profiled steps give the
    trace. ``init_cupti_for_graphs`` runs PyTorch's documented workaround (an empty
    profiler session before any graph is captured) in the graph modes; see the notes
    of the returned profile for how many kernels the trace actually saw.
    """
    if mode not in PROFILE_MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {PROFILE_MODES}")
    dev = pick_device(device) if isinstance(device, str) else torch.device(device)
    if mode in ("compile-ro", "cudagraph") and dev.type != "cuda":
        raise ValueError(f"mode {mode!r} needs a CUDA device, got {dev}")
    cfg, preset_name = _resolve(config)
    cfg.check_sequence(T)
    model = build_model(cfg, seed=seed).to(dev).train()
    x, y = synthetic_batch(cfg.vocab_size, B, T, generator=torch.Generator().manual_seed(seed), device=dev)
    notes: list[str] = []
    if mode in ("compile-ro", "cudagraph") and init_cupti_for_graphs:
        from torch.profiler._utils import _init_for_cuda_graphs

        _init_for_cuda_graphs()

    # Like train_step, autocast only the forward (and loss); around the whole step, the precision's
    # TF32 flags (strict fp32 matmuls for bf16 and fp16).
    prec = Precision.of(precision)
    dtype = prec.autocast
    with prec.matmul_flags():
        if mode == "cudagraph":
            res = _profile_graph(model, x, y, dev, dtype, steps, warmup, timing_steps, notes)
        else:
            res = _profile_eagerish(model, x, y, dev, mode, dtype, steps, warmup, timing_steps, notes)
    step_ms, step_ms_prof, windows, op_names, graph_phase_us = res

    gpu = dev.type == "cuda"
    step_windows = [w for w in windows if w.name == STEP_RANGE]
    phase_source = "trace"
    if mode == "cudagraph":
        refs = {w.name[len(GRAPH_REF):]: [e.name for e in sorted(w.work, key=lambda e: e.ts)]
                for w in windows if w.name.startswith(GRAPH_REF)}
        split = [split_graph_step(w, refs) for w in step_windows]
        phase_source = "graph-prefix" if split and all(split) else "none"
        if phase_source == "none":
            notes.append("whole-step graph kernels not split by phase (reference sequences did not "
                         "match or no kernels traced); phases come from the three-graph differences")
    kernels, phase_us = aggregate(step_windows)
    n = max(len(step_windows), 1)
    kernels_per_step = sum(len(w.work) for w in step_windows) / n
    if gpu and kernels_per_step == 0:
        notes.append("the profiler saw no GPU kernels in the profiled steps")
        phase_source = "none"
    busy = sum(w.busy_us() for w in step_windows) / n if kernels_per_step else None
    # On GPU the unprofiled step time is the honest reference (the profiler slows the CPU
    # side, not the kernels); on CPU the ops themselves are slowed, so compare like with like.
    ref_ms = step_ms if gpu else step_ms_prof
    gaps = max(ref_ms * 1e3 - busy, 0.0) if busy is not None else None
    backend = sdpa_backend_from_ops(list(op_names) + [k.name for k in kernels])
    if cfg.attn_impl == "sdpa" and backend == "none (explicit softmax)":
        backend = "math (decomposed by the compiler)"  # Inductor lowers math SDPA to plain kernels
    return Profile(
        preset=preset_name, config=cfg.to_dict(), B=B, T=T, precision=precision, mode=mode,
        device_slug=device_slug(dev), steps=len(step_windows), step_ms=step_ms,
        step_ms_profiled=step_ms_prof, busy_us=busy, gaps_us=gaps, phase_us=phase_us,
        phase_source=phase_source, graph_phase_us=graph_phase_us, kernels=kernels,
        sdpa_backend=backend, kernels_per_step=kernels_per_step,
        launches_per_step=sum(w.launches for w in step_windows) / n, notes=notes,
        provenance=provenance(dev),
        optimizer="adamw-fused-capturable" if mode == "cudagraph" else
        "adamw-foreach" if dev.type == "cuda" else "adamw-default",
    )


def _profile_eagerish(model, x, y, dev, mode, dtype, steps, warmup, timing_steps, notes):
    """eager / compile / compile-ro: phases from the ranges around each part."""
    if mode != "eager":
        torch._dynamo.reset()  # a fresh compile per profile; stale guards would recompile anyway
        model = torch.compile(model, mode="reduce-overhead" if mode == "compile-ro" else None)
    opt = make_optimizer(model)
    step = _marked_step(model, opt, x, y, mode, dtype)
    timer = partial(time_once, device=dev)
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    sync(dev)
    if mode != "eager":
        notes.append(f"warm-up incl. compilation: {time.perf_counter() - t0:.1f} s")
    step_ms = statistics.median(timer(step) for _ in range(timing_steps))
    prof_ms: list[float] = []
    with torch.profiler.profile(activities=_activities(dev)) as prof:
        for _ in range(steps):
            with record_function(STEP_RANGE):
                prof_ms.append(timer(step))
        sync(dev)
    events = _trace_events(prof)
    windows = parse_trace(events, gpu=dev.type == "cuda")
    op_names = {e["name"] for e in events if e.get("cat") == "cpu_op"}
    return step_ms, statistics.fmean(prof_ms), windows, op_names, None


def _profile_graph(model, x, y, dev, dtype, steps, warmup, timing_steps, notes):
    """The whole eager step in one CUDA graph; phases from three graphs' replay times."""
    opt = make_optimizer(model, fused=True, capturable=True)  # as the benchmark's cudagraph mode
    static: dict[str, torch.Tensor] = {}

    # Autocast's weight-cast cache must be off under capture (torch.cuda.graph docs).
    def fwd() -> None:
        opt.zero_grad(set_to_none=True)
        with _autocast(dev, dtype, cache=False):
            static["loss"] = model(x, y)[1]

    def fwd_bwd() -> None:
        fwd()
        static["loss"].backward()

    def full() -> None:  # train_step, with the capture-safe autocast
        fwd_bwd()
        opt.step()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(max(warmup, 1)):  # also creates AdamW's state before capture
            full()
    torch.cuda.current_stream().wait_stream(s)
    # The backend choice is the same under capture; read it from one profiled eager step.
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as p0:
        full()
    sync(dev)
    op_names = {e.name for e in p0.events()}
    graphs = {}
    for name, fn in (("forward", fwd), ("forward+backward", fwd_bwd), ("step", full)):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        graphs[name] = g
    static.clear()
    timer = partial(time_once, device=dev)
    med = {}
    for name, g in graphs.items():
        for _ in range(3):
            g.replay()
        med[name] = statistics.median(timer(g.replay) for _ in range(timing_steps))
    graph_phase_us = {
        "forward": med["forward"] * 1e3,
        "backward": (med["forward+backward"] - med["forward"]) * 1e3,
        "optimizer": (med["step"] - med["forward+backward"]) * 1e3,
    }
    prof_ms: list[float] = []
    with torch.profiler.profile(activities=_activities(dev)) as prof:
        for name in ("forward", "forward+backward"):
            with record_function(GRAPH_REF + name):
                graphs[name].replay()
            sync(dev)
        for _ in range(steps):
            with record_function(STEP_RANGE):
                prof_ms.append(timer(graphs["step"].replay))
        sync(dev)
    windows = parse_trace(_trace_events(prof), gpu=True)
    return med["step"], statistics.fmean(prof_ms), windows, op_names, graph_phase_us


# --------------------------------------------------------------------------- storage
def to_row(profile: Profile) -> dict[str, Any]:
    """The stored form of a profile: one JSON-serializable row, nested tidy lists inside."""
    p = profile
    return {
        "key": p.key, "bench": BENCH, "status": "ok", "preset": p.preset,
        "config_hash": ModelConfig(**p.config).config_hash(), "config": p.config,
        "B": p.B, "T": p.T, "precision": p.precision, "mode": p.mode, "device_slug": p.device_slug,
        "steps": p.steps, "step_ms": p.step_ms, "step_ms_profiled": p.step_ms_profiled,
        "busy_us": p.busy_us, "gaps_us": p.gaps_us, "phase_source": p.phase_source,
        "phases": [{"phase": k, "total_us": v} for k, v in sorted(p.phase_us.items())],
        "graph_phases": ([{"phase": k, "total_us": v} for k, v in p.graph_phase_us.items()]
                         if p.graph_phase_us is not None else None),
        "kernels": [vars(k).copy() for k in p.kernels],
        "sdpa_backend": p.sdpa_backend, "kernels_per_step": p.kernels_per_step,
        "launches_per_step": p.launches_per_step, "optimizer": p.optimizer, "notes": list(p.notes),
        "provenance": dict(p.provenance),
    }


def profile_suite(
    presets: Sequence[str],
    modes: Sequence[str],
    precisions: Sequence[str],
    B: int,
    T: int,
    device: torch.device | str = "auto",
    store: bool = True,
    steps: int = 5,
    warmup: int = 3,
    timing_steps: int = 20,
    root: Path | str | None = None,
    **overrides: Any,
) -> list[dict[str, Any]]:
    """Profile every preset x mode x precision; append rows to ``<slug>/profile.jsonl``.

    Keys already stored (with status 'ok') are skipped, so an interrupted GPU run resumes.
    A failing combination is stored with ``status='error'`` and retried next time.
    ``overrides`` are config fields applied to every preset (e.g. ``n_layer=1`` for a smoke run).
    """
    from ftlib.harness.results import ResultStore

    dev = pick_device(device) if isinstance(device, str) else torch.device(device)
    db = ResultStore(BENCH, device_slug(dev), root)
    rows = []
    for name in presets:
        cfg = preset(name, **overrides)
        for mode in modes:
            for prec in precisions:
                key = profile_key(cfg, B, T, prec, mode, name)
                if store and db.has(key, skip_status=("error",)):
                    continue
                try:
                    p = profile_step(cfg, B, T, prec, mode, dev, steps, warmup, timing_steps)
                    p.preset = name
                    row = to_row(p)
                except Exception as e:  # one failing mode (e.g. compile) must not stop the suite
                    row = {"key": key, "bench": BENCH, "status": "error", "preset": name,
                           "B": B, "T": T, "precision": prec, "mode": mode,
                           "device_slug": device_slug(dev), "error": f"{type(e).__name__}: {e}"[:2000]}
                if store:
                    db.append(row)
                rows.append(row)
    return rows
