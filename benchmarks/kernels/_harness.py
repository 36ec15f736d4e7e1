"""Shared check-then-time loop for the benchmarks/kernels drivers (after llm.c's dev/cuda/*.cu mains).

Each driver builds fresh random inputs, runs every variant once and checks it against the
reference (max relative error against a tolerance), then - unless ``--check-only`` - times
it two ways:

* ``eager``: the call as a user makes it (autograd, allocations, launches from Python),
  with ``triton.testing.do_bench`` (which zeroes a 256 MB buffer before each call, so the
  L2 is cold). At these sizes this mostly measures the host (benchmarks/kernels/NOTES.md).
* ``graph``: the same call captured once in a ``torch.cuda.CUDAGraph`` and replayed, each
  replay timed with CUDA events after an untimed L2 flush. One replay launches the captured
  kernels back to back, so this measures the kernels, not the host.

Every (variant, timing) gives one tidy row (:func:`make_row`): op, variant, shape, dtype,
median / p20 / p80 in microseconds, the bytes and FLOPs the driver counts, achieved GB/s
and TFLOP/s, the fraction of the device's datasheet peak (``ftlib.analysis.peaks``), the check's
error and tolerance, and provenance. Rows go to a :class:`Recorder` (the ``kernels`` suite
of ``ci/gpu_bench.py``, or ``--record``): stored in ``kernels.jsonl``, skipped when their
keys are already stored, and no new variant starts after the recorder's deadline. ``--fresh``
times every variant again: its rows' keys carry the run id, so the rows of earlier runs are
neither skipped nor replaced, and a figure that compares variants of one run (``ftlib.views.kernels``)
finds them all in this one.

Without CUDA the drivers run their Triton kernels in the interpreter at tiny sizes; that
has to be switched on before triton is imported, hence :func:`setup` runs before the
drivers import anything from ``kernels``. Timing there is wall clock of the interpreter
(it exercises the code path, it says nothing about kernels) and graph timing is skipped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ftlib.core.timing import summarize_ms

BENCH = "kernels"  # the ResultStore stem: data/results/<gpu>/kernels.jsonl
L2_FLUSH_BYTES = 256 * 2**20  # what do_bench zeroes too; the H200's L2 is 50 MB
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


@dataclass
class Variant:
    name: str
    fn: Callable[[], object]  # runs the op (forward, or forward + backward) and returns what is checked
    tol: float  # max relative error (max |got - want| / max |want|) against the reference
    gpu_only: bool = False  # torch.compile / SDPA / fused optimizers: skipped in interpreter checks
    bench: Callable[[], object] | None = None  # what is timed, when not fn (fn's extra work left out)
    impl: str = ""  # 'pytorch', 'compile' or 'triton'; guessed from the name when empty
    precision: str = ""  # matmul precision ('fp32', 'tf32', 'bf16') when not the storage dtype's
    capturable: bool = True  # False: cannot run inside a CUDA graph (host-side state), row says so
    note: str = ""  # why not capturable, or anything a reader of the row needs


def impl_of(v: Variant) -> str:
    if v.impl:
        return v.impl
    name = v.name.lower()
    return "triton" if "triton" in name else "compile" if "compile" in name else "pytorch"


@dataclass
class Recorder:
    """Where rows go: a ResultStore (None: kept in ``rows`` only), a deadline, a callback per row."""

    store: Any = None  # ftlib.harness.results.ResultStore
    deadline: float | None = None  # time.monotonic() after which no new variant starts
    on_row: Callable[[dict], None] | None = None
    rows: list[dict] = field(default_factory=list)
    stopped: bool = False

    def has(self, key: str) -> bool:
        return self.store is not None and self.store.has(key, skip_status=("error",))

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if self.store is not None:
            self.store.append(row)
        if self.on_row is not None:
            self.on_row(row)

    def out_of_time(self) -> bool:
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.stopped = True
        return self.stopped


def parse_args(description: str, argv: list[str] | None = None, recorder: Recorder | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--check-only", action="store_true", help="check variants against the reference; no timing")
    ap.add_argument("--variants", default="", help="comma-separated variant names (default: all)")
    ap.add_argument("--record", action="store_true",
                    help="store rows in data/results/<device>/kernels.jsonl (skipping rows already there)")
    ap.add_argument("--fresh", action="store_true",
                    help="with --record: time every variant again in this run (keys carry the run id), so "
                         "variants added after an earlier run are compared with the rest in one run")
    ap.add_argument("--reps", type=int, default=3, help="timed calls per variant on CPU (wall clock)")
    args = ap.parse_args(argv)
    args.recorder = recorder
    return args


def use_interpreter() -> None:
    """Switch Triton to its CPU interpreter; exit if triton was imported before that was possible."""
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("triton was imported before TRITON_INTERPRET=1 could be set")
    os.environ["TRITON_INTERPRET"] = "1"


def setup(args: argparse.Namespace) -> torch.device:
    """Pick the device (CUDA, else the CPU with the Triton interpreter); make the recorder for --record."""
    if torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        use_interpreter()
        device = torch.device("cpu")
    if getattr(args, "record", False) and getattr(args, "recorder", None) is None:
        from ftlib.core.device import device_slug
        from ftlib.harness.results import ResultStore

        args.recorder = Recorder(ResultStore(BENCH, device_slug(device)))
    return device


def _flatten(out: object) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flatten(o)]  # type: ignore[union-attr]


def rel_err(got: object, want: object) -> float:
    errs = []
    for a, b in zip(_flatten(got), _flatten(want)):
        b64 = b.detach().double()
        errs.append(((a.detach().double() - b64).abs().max() / b64.abs().max().clamp_min(1e-30)).item())
    return max(errs)


def kernel_row_key(op: str, variant: str, shape: dict, dtype: str, timing: str, run: str | None = None) -> str:
    """Stable short hash of what a row measured (same format as ftlib.harness.results.row_key); with ``run``
    (``--fresh``) the run id is part of it, so each fresh run stores its own rows."""
    ident = {"bench": BENCH, "op": op, "variant": variant, "shape": shape, "dtype": dtype, "timing": timing,
             **({"run": run} if run else {})}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def quantiles_us(times_ms: list[float]) -> dict[str, float]:
    """Median, p20 and p80 in microseconds (``ftlib.core.timing.summarize_ms``), and the count."""
    s = summarize_ms(times_ms)
    return {"median_us": s["median_ms"] * 1e3, "p20_us": s["p20_ms"] * 1e3, "p80_us": s["p80_ms"] * 1e3,
            "n_reps": len(times_ms)}


def time_eager(fn: Callable[[], object], device: torch.device, reps: int = 3) -> dict[str, Any]:
    """The call as a user makes it: do_bench on a GPU (cold L2), wall clock on the CPU."""
    if device.type == "cuda":
        import triton.testing

        med, p20, p80 = triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.2, 0.8])
        return {"median_us": med * 1e3, "p20_us": p20 * 1e3, "p80_us": p80 * 1e3, "n_reps": None,
                "timer": "triton.testing.do_bench"}
    fn()  # warm-up: the interpreter's first call builds its kernel objects
    times = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return {**quantiles_us(times), "timer": "perf-counter (Triton interpreter)"}


def time_graph(fn: Callable[[], object], rep_ms: float = 100.0, min_reps: int = 50, max_reps: int = 2000,
               warmup: int = 10) -> dict[str, Any]:
    """Capture ``fn`` once in a CUDA graph, replay it; each replay timed with CUDA events, cold L2.

    Warm-up on a side stream first (PyTorch's whole-network capture recipe: Triton JIT,
    cuBLAS workspaces and autograd's lazy state must not be created during capture).
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(warmup):
        graph.replay()
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")

    def timed(n: int) -> list[float]:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for s, e in zip(starts, ends):
            flush.zero_()  # untimed: evicts the inputs from L2, as do_bench does
            s.record()
            graph.replay()
            e.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    estimate = statistics.median(timed(5))
    n = int(min(max_reps, max(min_reps, rep_ms / max(estimate, 1e-3))))
    return {**quantiles_us(timed(n)), "timer": "cuda-graph replay, cuda events"}


def _peak(device: torch.device, bound: str, precision: str) -> float | None:
    """Datasheet peak (GB/s, or TFLOP/s at ``precision``) of this GPU by name; None off-GPU or unknown."""
    if device.type != "cuda":
        return None
    from ftlib.analysis.peaks import lookup

    try:
        d = lookup(torch.cuda.get_device_name(device))
        if bound == "memory":
            return d.bandwidth_gbs
        # 3xTF32 issues three TF32 products per product: a third of the TF32 rate is its peak
        return d.rate("tf32") / 3e12 if precision == "tf32x3" else d.rate(precision) / 1e12
    except (KeyError, ValueError):
        return None


def make_row(*, op: str, variant: str, impl: str, case: str, shape: dict, dtype: str, precision: str,
             timing: str, device: torch.device, nbytes: float | None, flops: float | None, bound: str,
             status: str, timed: dict | None = None, check_err: float | None = None,
             check_tol: float | None = None, note: str = "", keyed_run: str | None = None) -> dict[str, Any]:
    """One tidy row of kernels.jsonl.

    Fields: ``key`` (hash of op, variant, shape, dtype, timing, and ``keyed_run`` where given: the run id of a
    ``--fresh`` run, also a field), ``bench`` ('kernels'),
    ``op`` ('rmsnorm', 'layernorm', 'cross_entropy', 'adamw', 'attention', 'ceiling'),
    ``variant`` ('v3 triton'), ``impl`` ('pytorch' / 'compile' / 'triton'), ``case`` (the
    driver's title), ``shape`` (dict of named sizes), ``dtype`` (storage: 'fp32', 'bf16'),
    ``precision`` (matmul precision: 'fp32', 'tf32', 'bf16'), ``timing`` ('eager' / 'graph'),
    ``status`` ('ok', 'skipped', 'unsupported', 'check_failed', 'error') with ``note``
    saying why, ``median_us`` / ``p20_us`` / ``p80_us`` / ``n_reps`` / ``timer``, ``bytes``
    and ``flops`` (what the driver counts; None where not counted), ``bound`` ('memory' /
    'compute'), ``gb_s`` and ``tflop_s`` (achieved), ``peak`` / ``peak_unit`` /
    ``frac_peak`` (against the datasheet peak of this GPU by name, ``ftlib.analysis.peaks``),
    ``check_err`` / ``check_tol`` / ``check_ok``, ``l2`` ('cold' on a GPU), and the
    provenance of ``ftlib.harness.provenance.provenance`` plus ``device_slug``.
    """
    from ftlib.core.device import device_slug
    from ftlib.harness.provenance import provenance

    row: dict[str, Any] = {
        "key": kernel_row_key(op, variant, shape, dtype, timing, keyed_run), "bench": BENCH, "op": op,
        "variant": variant, "impl": impl, "case": case, "shape": shape, "dtype": dtype, "precision": precision,
        "timing": timing,
        "status": status, "note": note, "bytes": nbytes, "flops": flops, "bound": bound,
        "check_err": check_err, "check_tol": check_tol,
        "check_ok": None if check_err is None else bool(check_err <= check_tol),
        "median_us": None, "p20_us": None, "p80_us": None, "n_reps": None, "timer": None,
        "gb_s": None, "tflop_s": None, "peak": None, "peak_unit": "GB/s" if bound == "memory" else "TFLOP/s",
        "frac_peak": None, "l2": "cold" if device.type == "cuda" else None, "keyed_run": keyed_run,
        "device_slug": device_slug(device), **provenance(device),
    }
    if timed:
        row.update(timed)
        s = row["median_us"] * 1e-6
        row["gb_s"] = nbytes / s / 1e9 if nbytes else None
        row["tflop_s"] = flops / s / 1e12 if flops else None
        row["peak"] = _peak(device, bound, precision)
        rate = row["gb_s"] if bound == "memory" else row["tflop_s"]
        row["frac_peak"] = rate / row["peak"] if (rate and row["peak"]) else None
    return row


def run(
    title: str,
    args: argparse.Namespace,
    device: torch.device,
    reference: Callable[[], object],
    variants: list[Variant],
    work: float | None = None,
    unit: str = "GB/s",
    *,
    op: str | None = None,
    shape: dict | None = None,
    dtype: torch.dtype | str | None = None,
    nbytes: float | None = None,
    flops: float | None = None,
) -> bool:
    """Check every variant, then time it eagerly and in a CUDA graph, one row per timing.

    ``work`` is bytes (unit 'GB/s') or FLOPs ('TFLOP/s') for drivers that count only one;
    ``nbytes`` and ``flops`` give both. The unit says what bounds the op ('GB/s': memory).
    Returns True when every checked variant is within its tolerance.
    """
    bound = "memory" if unit == "GB/s" else "compute"
    if work is not None:
        if bound == "memory" and nbytes is None:
            nbytes = work
        if bound == "compute" and flops is None:
            flops = work
    op = op or title.split()[0]
    shape = shape or {}
    dname = DTYPE_NAMES.get(dtype, str(dtype)) if isinstance(dtype, torch.dtype) else (dtype or "")
    rec: Recorder | None = getattr(args, "recorder", None)
    chosen = {v for v in args.variants.split(",") if v}
    from ftlib.harness.provenance import run_id

    keyed_run = run_id() if getattr(args, "fresh", False) else None  # --fresh: this run's own keys
    want = reference()
    ok = True
    print(f"== {title} on {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU (Triton interpreter)'}")
    for v in variants:
        if chosen and v.name not in chosen:
            continue
        prec = v.precision or dname
        common = dict(op=op, variant=v.name, impl=impl_of(v), case=title, shape=shape, dtype=dname,
                      precision=prec, device=device, nbytes=nbytes, flops=flops, bound=bound, keyed_run=keyed_run)
        timed_here = not args.check_only
        if rec is not None and timed_here:
            keys = [kernel_row_key(op, v.name, shape, dname, t, keyed_run) for t in ("eager", "graph")]
            if all(rec.has(k) for k in keys):
                print(f"{v.name:>24}: stored")
                continue
            if rec.out_of_time():
                print(f"{v.name:>24}: budget spent; stopping")
                return ok
        if v.gpu_only and device.type != "cuda":
            print(f"{v.name:>24}: skipped (GPU only)")
            if rec is not None and timed_here:
                for t in ("eager", "graph"):
                    rec.add(make_row(**common, timing=t, status="skipped",
                                     note="GPU only (torch.compile, SDPA's CUDA kernels or a CUDA optimizer)"))
            continue
        try:
            err = rel_err(v.fn(), want)
        except Exception as e:  # a variant that cannot run (compile error, OOM) is a row, not a crash
            ok = False
            print(f"{v.name:>24}: ERROR {type(e).__name__}: {e}"[:300])
            if rec is not None and timed_here:
                for t in ("eager", "graph"):
                    rec.add(make_row(**common, timing=t, status="error", note=f"{type(e).__name__}: {e}"[:1000]))
            continue
        passed = err <= v.tol
        ok &= passed
        line = f"{v.name:>24}: max rel err {err:.2e} (tol {v.tol:.2e}) {'OK' if passed else 'FAIL'}"
        if not timed_here:
            print(line)
            continue
        chk = dict(check_err=err, check_tol=v.tol)
        if not passed:  # a wrong kernel's speed is not worth a row's timing
            print(line)
            if rec is not None:
                for t in ("eager", "graph"):
                    rec.add(make_row(**common, timing=t, status="check_failed", **chk,
                                     note="not timed: the check failed"))
            continue
        fn = v.bench or v.fn
        rows = []
        try:
            t = time_eager(fn, device, getattr(args, "reps", 3))
            rows.append(make_row(**common, timing="eager", status="ok", timed=t, **chk, note=v.note))
            line += f" | eager {t['median_us']:9.1f} us"
        except Exception as e:
            rows.append(make_row(**common, timing="eager", status="error", **chk, note=f"{type(e).__name__}: {e}"))
            line += f" | eager ERROR {type(e).__name__}"
        if device.type != "cuda":
            rows.append(make_row(**common, timing="graph", status="skipped", **chk,
                                 note="CUDA graphs need a GPU: graph timing skipped on the CPU"))
        elif not v.capturable:
            rows.append(make_row(**common, timing="graph", status="unsupported", **chk,
                                 note=v.note or "cannot be captured in a CUDA graph"))
            line += " | graph: not capturable"
        else:
            try:
                t = time_graph(fn)
                rows.append(make_row(**common, timing="graph", status="ok", timed=t, **chk, note=v.note))
                line += f" | graph {t['median_us']:9.1f} us"
            except Exception as e:  # capture failures (a host sync inside) are findings too
                rows.append(make_row(**common, timing="graph", status="error", **chk,
                                     note=f"{type(e).__name__}: {e}"[:1000]))
                line += f" | graph ERROR {type(e).__name__}"
        graph_ok = [r for r in rows if r["timing"] == "graph" and r["status"] == "ok"]
        best = graph_ok[0] if graph_ok else rows[0]
        rate = best["gb_s"] if bound == "memory" else best["tflop_s"]
        if rate:
            line += f" | {rate:8.1f} {unit} ({best['timing']})"
        print(line)
        if rec is not None:
            for r in rows:
                rec.add(r)
    return ok
