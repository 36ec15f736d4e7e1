"""Measured profiles of one training step: where the device time goes, by phase and kernel.

The timed region is the original benchmark's: zero_grad(set_to_none) + forward + loss +
backward + AdamW step. :func:`profile_step` runs it under ``torch.profiler`` and reads the
Chrome trace the profiler exports:

* **Phases.** Each step is wrapped in a ``ftlib::step`` range and its forward, backward
  and optimizer parts in ``ftlib::forward`` / ``ftlib::backward`` / ``ftlib::optimizer``
  ranges (``record_function``). A GPU kernel belongs to the phase whose CPU range *launched*
  it: the kernel event and its launch (``cudaLaunchKernel``, ``cuLaunchKernel`` for Triton,
  ``cudaGraphLaunch``) share a ``correlation`` id, and the launch's CPU timestamp falls
  inside exactly one range. Kernels run later than they are launched, so their own
  timestamps would smear across phases; the launch time does not. Backward kernels are
  launched from autograd's worker thread, but that thread runs while the main thread sits
  inside ``loss.backward()``, so time containment still finds the right range.
* **Categories.** :func:`classify_kernel` sorts kernel names into matmul, attention,
  softmax, norm, elementwise, reduction, optimizer, memcpy/memset and other.
* **Launch gaps.** Step time (CUDA events around the step, measured in a separate loop
  without the profiler, whose CPU overhead would widen the gaps) minus the union of the
  intervals in which some kernel of the step was running.
* **SDPA backend.** Which attention kernel actually ran, from the CPU op names
  (``aten::_scaled_dot_product_efficient_attention`` ...) and the kernel names
  (``fmha_cutlassF`` ...): :func:`sdpa_backend_from_ops`.

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

On CPU there are no kernels: every CPU op counts with its self time (its duration minus
that of the ops it calls), and the step time is wall time. That keeps the whole path
testable in CI at tiny sizes.
"""

from __future__ import annotations

import contextlib
import json
import re
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, record_function

from ftlib.core.device import device_slug, pick_device
from ftlib.core.precision import precision_region as precision_ctx
from ftlib.harness.provenance import provenance
from ftlib.model.config import ModelConfig, preset
from ftlib.model.gpt import build_model
from ftlib.training.data import synthetic_batch
from ftlib.training.step import make_optimizer

BENCH = "profile"
MODES = ("eager", "cudagraph", "compile", "compile-ro")  # the names ftlib.harness.bench.runners uses
PHASES = ("forward", "backward", "optimizer")
OTHER_PHASE = "other"  # in the step but outside the three ranges (zero_grad, graph bookkeeping)
STEP_PHASE = "step"  # a whole-step graph whose kernels could not be split into phases
CATEGORIES = (
    "matmul", "attention", "softmax", "norm", "elementwise", "reduction", "optimizer",
    "memcpy/memset", "other",
)
SDPA_BACKENDS = ("cudnn", "flash", "flash (cpu)", "mem_efficient", "math", "unknown",
                 "none (explicit softmax)")

_STEP = "ftlib::step"
_PHASE_PREFIX = "ftlib::"
_GRAPH_REF = "ftlib::graph:"  # reference replays of the forward and forward+backward graphs
_KERNEL_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
_LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}


# --------------------------------------------------------------------------- kernel names

def _has(s: str, *parts: str) -> bool:
    return any(p in s for p in parts)


# aten op base names (``aten::add_`` -> ``add``) by category, for CPU traces.
_ATEN = {
    "matmul": {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot"},
    "softmax": {"softmax", "log_softmax", "softmax_backward_data", "log_softmax_backward_data"},
    "norm": {"native_layer_norm", "layer_norm", "native_layer_norm_backward", "rms_norm",
             "fused_rms_norm", "fused_rms_norm_backward"},
    "memcpy/memset": {"copy", "fill", "zero", "to", "to_copy", "clone", "contiguous", "cat",
                      "zeros", "ones", "zeros_like", "ones_like", "full"},
    "reduction": {"sum", "mean", "amax", "amin", "max", "min", "norm", "nll_loss_forward",
                  "nll_loss_backward", "nll_loss", "nll_loss_nd", "cross_entropy_loss",
                  "linalg_vector_norm"},
    "elementwise": {"add", "mul", "div", "sub", "rsub", "exp", "neg", "rsqrt", "sqrt", "pow",
                    "gelu", "gelu_backward", "tanh", "tanh_backward", "masked_fill", "where",
                    "lerp", "addcmul", "addcdiv", "abs", "sign", "clamp", "maximum", "minimum",
                    "reciprocal", "sigmoid", "dropout", "native_dropout", "tril", "triu"},
}


def _classify_triton(n: str) -> str:
    # Inductor names its kernels after the ops it fused: triton_{poi,red,per,tem}_fused_<ops>_<i>.
    if "softmax" in n:
        return "softmax"
    if _has(n, "layer_norm", "rms_norm", "rmsnorm") or ("rsqrt" in n and "mean" in n):
        return "norm"
    if n.startswith("triton_tem") or re.search(r"(^|_)(add|b)?mm(_|$)", n):
        return "matmul"
    if _has(n, "adam", "foreach"):
        return "optimizer"
    if n.startswith("triton_poi"):
        return "elementwise"
    if n.startswith(("triton_red", "triton_per")):
        return "reduction"
    return "other"


def classify_kernel(name: str) -> str:
    """The component category of a GPU kernel name (or, on CPU, of an aten op name).

    Rules are ordered: attention before matmul (``fmha_cutlassF`` contains 'cutlass'),
    optimizer before elementwise (``multi_tensor_apply_kernel<..., FusedAdamMathFunctor>``),
    copies and fills before elementwise (``elementwise_kernel<..., direct_copy_kernel_cuda>``).
    """
    n = name.lower()
    if n.startswith(("autograd::", "torch::autograd", "optimizer.", "profilerstep", "ftlib::")) or \
            re.search(r"backward\d*$", n) and "::" not in n:
        return "other"  # CPU-side wrappers (autograd nodes): their self time is dispatch overhead
    if n.startswith("triton_"):
        return _classify_triton(n)
    if _has(n, "fmha", "flash", "attention", "mem_eff", "sdpa", "scaled_dot_product"):
        return "attention"
    base = n.split("::")[-1].split(".")[0].strip("_") if "::" in n else None
    if base is not None:  # an aten op (CPU traces)
        for cat in ("matmul", "softmax", "norm", "memcpy/memset", "reduction", "elementwise"):
            if base in _ATEN[cat]:
                return cat
        if base.startswith("foreach") or "adam" in base:
            return "optimizer"
    if _has(n, "gemm", "gemv", "cublas", "cutlass", "xmma", "nvjet", "splitkreduce"):
        return "matmul"
    if "softmax" in n:
        return "softmax"
    if _has(n, "layer_norm", "layernorm", "rms_norm", "rmsnorm", "gammabetabackward"):
        return "norm"
    if _has(n, "multi_tensor_apply", "multitensorapply", "adam", "foreach"):
        return "optimizer"
    if n.startswith(("memcpy", "memset")) or _has(n, "fillfunctor", "copy_kernel", "catarraybatchedcopy"):
        return "memcpy/memset"
    if _has(n, "reduce_kernel", "reduction", "nll_loss", "reduce"):
        return "reduction"
    if _has(n, "elementwise", "gelu", "tanh", "addcmul", "addcdiv", "lerp", "sqrt", "masked_fill",
            "where", "pow", "sigmoid"):
        return "elementwise"
    return "other"


def sdpa_backend_from_ops(names: Iterable[str]) -> str:
    """Which SDPA backend ran, from CPU op names and/or kernel names of a trace.

    CUDA: ``aten::_scaled_dot_product_{flash,efficient,cudnn}_attention`` or kernels
    ``flash_fwd*`` / ``fmha_cutlass*`` / ``cudnn*sdpa*``; the math fallback shows up as
    ``aten::_scaled_dot_product_attention_math``. CPU: ``..._flash_attention_for_cpu`` or the
    math op. No SDPA op and no fused kernel at all means the model's own softmax attention.
    Several backends in one trace are joined with '+'.
    """
    found: set[str] = set()
    sdpa_called = False
    for name in names:
        n = name.lower()
        if "scaled_dot_product" in n:
            sdpa_called = True
        if _has(n, "cudnn_attention") or ("cudnn" in n and _has(n, "sdpa", "fprop", "bprop", "attn")):
            found.add("cudnn")
        elif "flash_attention_for_cpu" in n:
            found.add("flash (cpu)")
        elif _has(n, "_flash_attention", "flash_fwd", "flash_bwd", "pytorch_flash"):
            found.add("flash")
        elif _has(n, "efficient_attention", "fmha_cutlass", "mem_efficient", "mem_eff_attention"):
            found.add("mem_efficient")
        elif "_scaled_dot_product_attention_math" in n:
            found.add("math")
    if found:
        return "+".join(b for b in SDPA_BACKENDS if b in found)
    return "unknown" if sdpa_called else "none (explicit softmax)"


# --------------------------------------------------------------------------- trace parsing

@dataclass
class _Ev:
    name: str
    ts: float  # microseconds, profiler clock
    dur: float  # the interval counted in the busy union (0 for a CPU op nested in another)
    at: float  # when it was issued: launch time for a kernel, start for a CPU op
    self_us: float = 0.0
    phase: str = OTHER_PHASE
    end: float = 0.0


@dataclass
class _Window:
    """One ``ftlib::step`` (or graph reference) range and the work issued inside it."""

    name: str
    ts: float
    dur: float
    work: list[_Ev] = field(default_factory=list)
    launches: int = 0

    def busy_us(self) -> float:
        """Length of the union of the work intervals: time some kernel (or op) was running."""
        total, end = 0.0, float("-inf")
        for e in sorted(self.work, key=lambda e: e.ts):
            lo, hi = max(e.ts, end), e.ts + e.dur
            if hi > lo:
                total += hi - lo
            end = max(end, hi)
        return total


def _cpu_self_times(ops: list[dict]) -> list[_Ev]:
    """CPU ops with self time; only top-level ops keep their duration for the busy union.

    Ops nest on a thread (aten::linear -> aten::addmm), so summing durations would count
    time twice. A stack walk in start order subtracts each op from its direct parent.
    """
    out: list[_Ev] = []
    by_tid: dict[Any, list[dict]] = defaultdict(list)
    for e in ops:
        by_tid[e.get("tid")].append(e)
    for evs in by_tid.values():
        evs.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        stack: list[_Ev] = []
        for e in evs:
            ev = _Ev(e["name"], float(e["ts"]), float(e.get("dur", 0)), float(e["ts"]))
            ev.self_us = ev.dur
            ev.end = ev.ts + ev.dur
            while stack and ev.ts >= stack[-1].end - 1e-3:
                stack.pop()
            if stack:
                stack[-1].self_us -= ev.dur
                ev.dur = 0.0  # nested: its interval is already inside its parent's
            stack.append(ev)
            out.append(ev)
    for ev in out:
        ev.self_us = max(ev.self_us, 0.0)
    return out


def _inside(t: float, r: dict) -> bool:
    return r["ts"] <= t <= r["ts"] + r.get("dur", 0)


def parse_trace(events: Sequence[dict], gpu: bool) -> list[_Window]:
    """Windows (``ftlib::step`` and graph-reference ranges) with their work and phases.

    ``gpu=True``: work = kernel/memcpy/memset events, placed by their launch's CPU time
    (matched through ``args.correlation``). ``gpu=False``: work = CPU ops with self times.
    """
    ranges = [e for e in events if e.get("cat") == "user_annotation" and e.get("ph") == "X"
              and str(e.get("name", "")).startswith(_PHASE_PREFIX)]
    windows = [_Window(r["name"], float(r["ts"]), float(r.get("dur", 0)))
               for r in ranges if r["name"] == _STEP or r["name"].startswith(_GRAPH_REF)]
    windows.sort(key=lambda w: w.ts)
    phase_ranges = [r for r in ranges if r["name"][len(_PHASE_PREFIX):] in PHASES]
    launches = [e for e in events if e.get("cat") in _LAUNCH_CATS and "Launch" in str(e.get("name", ""))]

    if gpu:
        launch_at = {e["args"]["correlation"]: float(e["ts"]) for e in events
                     if e.get("cat") in _LAUNCH_CATS and "correlation" in e.get("args", {})}
        work = []
        for e in events:
            if e.get("cat") not in _KERNEL_CATS or e.get("ph") != "X":
                continue
            at = launch_at.get(e.get("args", {}).get("correlation"), float(e["ts"]))
            ev = _Ev(e["name"], float(e["ts"]), float(e.get("dur", 0)), at)
            ev.self_us = ev.dur
            work.append(ev)
    else:
        work = _cpu_self_times([e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"])

    for ev in work:
        for w in windows:
            if w.ts <= ev.at <= w.ts + w.dur:
                for r in phase_ranges:
                    if _inside(ev.at, r):
                        ev.phase = r["name"][len(_PHASE_PREFIX):]
                        break
                w.work.append(ev)
                break
    for e in launches:
        for w in windows:
            if w.ts <= float(e["ts"]) <= w.ts + w.dur:
                w.launches += 1
                break
    return windows


def _split_graph_step(step: _Window, refs: dict[str, list[str]]) -> bool:
    """Assign phases to a whole-step graph's kernels by the shorter graphs' sequences.

    A graph captured from one stream is a chain, so its kernels run in capture order; the
    step's first n_fwd kernels are the forward graph's if their names match one for one.
    """
    fwd, fb = refs.get("forward", []), refs.get("forward+backward", [])
    seq = sorted(step.work, key=lambda e: e.ts)
    names = [e.name for e in seq]
    if not fwd or len(fb) <= len(fwd) or names[: len(fwd)] != fwd or names[: len(fb)] != fb:
        for e in seq:
            e.phase = STEP_PHASE
        return False
    for i, e in enumerate(seq):
        e.phase = "forward" if i < len(fwd) else "backward" if i < len(fb) else "optimizer"
    return True


# --------------------------------------------------------------------------- the profile

@dataclass
class KernelRow:
    phase: str
    category: str
    name: str
    count: float  # launches per step
    total_us: float  # device (or CPU self) time per step


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


def _autocast_dtype(prec: str) -> torch.dtype | None:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(prec)


def _timer(dev: torch.device) -> Callable[[Callable[[], Any]], float]:
    """A function that runs ``fn`` once and returns its time in ms (CUDA events on GPU)."""
    if dev.type == "cuda":
        def run(fn: Callable[[], Any]) -> float:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b)
    else:
        def run(fn: Callable[[], Any]) -> float:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
    return run


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _trace_events(prof: torch.profiler.profile) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())["traceEvents"]


def _aggregate(steps: list[_Window]) -> tuple[list[KernelRow], dict[str, float]]:
    acc: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for w in steps:
        for e in w.work:
            a = acc[(e.phase, e.name)]
            a[0] += 1
            a[1] += e.self_us
    n = max(len(steps), 1)
    rows = [KernelRow(ph, classify_kernel(name), name, c / n, t / n) for (ph, name), (c, t) in acc.items()]
    rows.sort(key=lambda r: (r.phase, -r.total_us, r.name))
    phase_us: dict[str, float] = defaultdict(float)
    for r in rows:
        phase_us[r.phase] += r.total_us
    return rows, dict(phase_us)


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
        with record_function(_PHASE_PREFIX + "forward"), _autocast(dev, dtype):
            _, loss = model(x, y)
        with record_function(_PHASE_PREFIX + "backward"):
            loss.backward()
        with record_function(_PHASE_PREFIX + "optimizer"):
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
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
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

    # Like train_step, autocast only the forward (and loss); 'bf16'/'fp16' otherwise keep the
    # strict-fp32 matmul settings, which precision('fp32') sets.
    dtype = _autocast_dtype(precision)
    with precision_ctx("fp32" if dtype else precision, dev):
        if mode == "cudagraph":
            res = _profile_graph(model, x, y, dev, dtype, steps, warmup, timing_steps, notes)
        else:
            res = _profile_eagerish(model, x, y, dev, mode, dtype, steps, warmup, timing_steps, notes)
    step_ms, step_ms_prof, windows, op_names, graph_phase_us = res

    gpu = dev.type == "cuda"
    step_windows = [w for w in windows if w.name == _STEP]
    phase_source = "trace"
    if mode == "cudagraph":
        refs = {w.name[len(_GRAPH_REF):]: [e.name for e in sorted(w.work, key=lambda e: e.ts)]
                for w in windows if w.name.startswith(_GRAPH_REF)}
        split = [_split_graph_step(w, refs) for w in step_windows]
        phase_source = "graph-prefix" if split and all(split) else "none"
        if phase_source == "none":
            notes.append("whole-step graph kernels not split by phase (reference sequences did not "
                         "match or no kernels traced); phases come from the three-graph differences")
    kernels, phase_us = _aggregate(step_windows)
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
    timer = _timer(dev)
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    _sync(dev)
    if mode != "eager":
        notes.append(f"warm-up incl. compilation: {time.perf_counter() - t0:.1f} s")
    step_ms = statistics.median(timer(step) for _ in range(timing_steps))
    prof_ms: list[float] = []
    with torch.profiler.profile(activities=_activities(dev)) as prof:
        for _ in range(steps):
            with record_function(_STEP):
                prof_ms.append(timer(step))
        _sync(dev)
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
    _sync(dev)
    op_names = {e.name for e in p0.events()}
    graphs = {}
    for name, fn in (("forward", fwd), ("forward+backward", fwd_bwd), ("step", full)):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        graphs[name] = g
    static.clear()
    timer = _timer(dev)
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
            with record_function(_GRAPH_REF + name):
                graphs[name].replay()
            _sync(dev)
        for _ in range(steps):
            with record_function(_STEP):
                prof_ms.append(timer(graphs["step"].replay))
        _sync(dev)
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


_ID_FIELDS = ("key", "preset", "config_hash", "B", "T", "precision", "mode", "device_slug")


def to_rows(profile: Profile | dict) -> list[dict[str, Any]]:
    """Tidy rows (one per phase, category and kernel name) of a profile or a stored row."""
    row = to_row(profile) if isinstance(profile, Profile) else profile
    ident = {k: row.get(k) for k in _ID_FIELDS}
    return [{**ident, **k} for k in row.get("kernels") or []]


def select_rows(rows: Iterable[dict], B: int, T: int, **overrides: Any) -> list[dict[str, Any]]:
    """Stored rows measured at ``B`` x ``T`` on a preset with exactly these ``overrides``.

    Keeps a figure of the full models from mixing with smoke runs of smaller ones.
    """
    out = []
    for r in rows:
        if r.get("status", "ok") != "ok" or r.get("B") != B or r.get("T") != T or r.get("preset") is None:
            continue
        with contextlib.suppress(ValueError):
            if r.get("config") == preset(r["preset"], **overrides).to_dict():
                out.append(r)
    return out


def phase_breakdown(rows: Iterable[dict]) -> list[dict[str, Any]]:
    """Per stored profile: ms per step in forward, backward, optimizer, other and launch gaps.

    Phases are device-busy times from the trace. A whole-step CUDA graph whose kernels were
    not split falls back to the three-graph differences (which then include the gaps inside
    each graph, so no separate gap bar is drawn for it).
    """
    out = []
    for r in rows:
        if r.get("status", "ok") != "ok":
            continue
        ident = {k: r.get(k) for k in ("preset", "mode", "precision", "B", "T", "device_slug")}
        ident["step_ms"] = r.get("step_ms")
        ident["sdpa_backend"] = r.get("sdpa_backend")
        if r.get("phase_source") == "none" and r.get("graph_phases"):
            parts = {p["phase"]: p["total_us"] for p in r["graph_phases"]}
            source = "graph-difference"
        else:
            parts = {p["phase"]: p["total_us"] for p in r.get("phases") or []}
            parts["launch gaps"] = r.get("gaps_us") or 0.0
            source = r.get("phase_source")
        for ph in (*PHASES, OTHER_PHASE, STEP_PHASE, "launch gaps"):
            if ph in parts:
                out.append({**ident, "phase": ph, "ms": parts[ph] / 1e3, "source": source})
    return out


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
