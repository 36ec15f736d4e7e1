"""Reading a ``torch.profiler`` trace of training steps (:mod:`ftlib.harness.profiling` records it):

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

On CPU there are no kernels: every CPU op counts with its self time (its duration minus that of
the ops it calls), and the step time is wall time.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

PHASES = ("forward", "backward", "optimizer")
OTHER_PHASE = "other"  # in the step but outside the three ranges (zero_grad, graph bookkeeping)
STEP_PHASE = "step"  # a whole-step graph whose kernels could not be split into phases
CATEGORIES = (
    "matmul", "attention", "softmax", "norm", "elementwise", "reduction", "optimizer",
    "memcpy/memset", "other",
)
TRACED_SDPA_BACKENDS = ("cudnn", "flash", "flash (cpu)", "mem_efficient", "math", "unknown",
                 "none (explicit softmax)")

STEP_RANGE = "ftlib::step"
PHASE_PREFIX = "ftlib::"
GRAPH_REF = "ftlib::graph:"  # reference replays of the forward and forward+backward graphs
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
        return "+".join(b for b in TRACED_SDPA_BACKENDS if b in found)
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
class Window:
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


def parse_trace(events: Sequence[dict], gpu: bool) -> list[Window]:
    """Windows (``ftlib::step`` and graph-reference ranges) with their work and phases.

    ``gpu=True``: work = kernel/memcpy/memset events, placed by their launch's CPU time
    (matched through ``args.correlation``). ``gpu=False``: work = CPU ops with self times.
    """
    ranges = [e for e in events if e.get("cat") == "user_annotation" and e.get("ph") == "X"
              and str(e.get("name", "")).startswith(PHASE_PREFIX)]
    windows = [Window(r["name"], float(r["ts"]), float(r.get("dur", 0)))
               for r in ranges if r["name"] == STEP_RANGE or r["name"].startswith(GRAPH_REF)]
    windows.sort(key=lambda w: w.ts)
    phase_ranges = [r for r in ranges if r["name"][len(PHASE_PREFIX):] in PHASES]
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
                        ev.phase = r["name"][len(PHASE_PREFIX):]
                        break
                w.work.append(ev)
                break
    for e in launches:
        for w in windows:
            if w.ts <= float(e["ts"]) <= w.ts + w.dur:
                w.launches += 1
                break
    return windows


def split_graph_step(step: Window, refs: dict[str, list[str]]) -> bool:
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


@dataclass
class KernelRow:
    phase: str
    category: str
    name: str
    count: float  # launches per step
    total_us: float  # device (or CPU self) time per step


def aggregate(steps: list[Window]) -> tuple[list[KernelRow], dict[str, float]]:
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
