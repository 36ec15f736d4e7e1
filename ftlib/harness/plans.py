"""A chapter's measuring plan on one device: the cases its profile (:mod:`ftlib.harness.profiles`) leaves
there, a first guess of how long they take, and the call that measures them.

:func:`plan_here` is what a chapter calls: ``plan = plan_here("05", SMOKE, device)``, then
``print(plan.announce())`` and ``run_plan(plan, device)``. Under the T4 profile (``SMOKE='t4'``) the
cases keep only the precisions the device runs as labelled (:func:`ftlib.harness.precision_plan.case_why_not`:
fp32 and fp16 on a T4), and their rows go where full-size rows go (the device's results folder, or
``$FTLIB_MY_RESULTS``); a smoke run's baselines go to ``build/smoke-results`` as before.

**The estimate** (:meth:`ChapterPlan.estimate_s`), made before anything is measured:

* a step-benchmark case or a profile: the fixed cost of its mode (compiling, capturing, setting up:
  :data:`ftlib.harness.bench.cases.DEFAULT_COST_S`), plus its steps times a step time, plus
  :data:`PROCESS_START_S` where it runs in a fresh process;
* the step time: the step's bound from the FLOP and byte accounting (``ftlib.analysis.totals``: the
  larger of FLOPs over the device's datasheet rate for the precision and bytes over its bandwidth,
  ``ftlib.analysis.peaks``), divided by :data:`EFFICIENCY`, the share of that bound a real step is
  taken to reach;
* a training run: its steps and its evaluation batches (a forward, a third of a step) at that step
  time, plus the cost of compiling where the recipe compiles; a study with a budget takes at most it;
* the kernel benchmarks: a fixed guess per driver (:data:`KERNEL_DRIVER_S`).

It is a guess, made to say whether a chapter takes minutes or hours; the rows say how long it took.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import torch

from ftlib.analysis.accounting import num_params
from ftlib.analysis.peaks import PEAKS, DevicePeaks, lookup
from ftlib.analysis.totals import total_bytes, total_flops
from ftlib.core.device import DeviceInfo, device_slug
from ftlib.core.repo import repo_root
from ftlib.harness.bench.cases import DEFAULT_COST_S, Case, bench_cases, make_cases
from ftlib.harness.precision_plan import case_why_not
from ftlib.harness.profiles import Baselines, Kernels, Part, Profiles, Steps, Training, normalise_smoke, profile
from ftlib.harness.results import ResultStore
from ftlib.harness.suites import baselines, smoke_cases
from ftlib.model.config import ModelConfig, preset

EFFICIENCY = 0.4  # the share of the accounting's bound a real training step is taken to reach
PROCESS_START_S = 20.0  # a fresh process: the interpreter, torch, the CUDA context
PROFILE_TRACE_S = 5.0  # a profile's trace, read back and parsed
TRAIN_SETUP_S = 5.0  # a training run's model, data and sampled text
DEFAULT_WARMUP, DEFAULT_ITERS = 10, 50  # ftlib.harness.bench.step.bench_step's counts
KERNEL_DRIVER_S = 90.0  # one kernel driver: its variants checked and timed, one compiled
KERNEL_DRIVERS_ALL = 9  # the drivers of benchmarks.kernels.suite, for a run of every one
# A CPU has no datasheet entry: a nominal one, for the estimate only.
CPU_PEAKS = DevicePeaks("cpu", (0, 0), 1, fp32=0.2, tf32=None, bf16=None, fp16=0.2, bandwidth_gbs=20.0,
                        l2_mb=1.0, source="nominal CPU rates, for estimates only")


def device_peaks(info: DeviceInfo) -> DevicePeaks:
    """The datasheet peaks of the described device: by name, else the first of its capability, else
    the T4's (the slowest GPU of the table, so an unknown GPU is not promised a short run)."""
    if info.kind != "cuda":
        return CPU_PEAKS
    try:
        return lookup(info.name)
    except KeyError:
        same = [p for p in PEAKS.values() if p.capability == info.capability]
        return same[0] if same else lookup("Tesla T4")


def step_seconds(cfg: ModelConfig, B: int, T: int, precision: str, info: DeviceInfo) -> float:
    """A training step's time for the estimate: the accounting's bound on the device, over :data:`EFFICIENCY`."""
    peaks = device_peaks(info)
    rate = getattr(peaks, precision) or peaks.fp32  # no tensor cores for it: the FP32 pipes
    kw = dict(precision=precision, capability=info.capability)
    try:
        bound = max(total_flops(cfg, B, T, **kw) / (rate * 1e12), total_bytes(cfg, B, T, **kw) / peaks.bandwidth)
    except (KeyError, ValueError):  # a model the accounting does not cover: 6 FLOPs per parameter and token
        bound = 6 * num_params(cfg) * B * T / (rate * 1e12)
    return bound / EFFICIENCY


@dataclass(frozen=True)
class Planned:
    """One part of a chapter's profile on one device: its cases (step benchmarks and profiles), the
    reasons some were left out, the estimated seconds and the budget that caps them (None: none)."""

    spec: Part
    cases: tuple[Case, ...]
    count: int
    skipped: tuple[str, ...]
    work_s: float
    budget_s: float | None = None

    @property
    def estimate_s(self) -> float:
        return self.work_s if self.budget_s is None else min(self.work_s, self.budget_s)

    @property
    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the measuring call (counts and options) of a step-benchmark part."""
        return step_kwargs(self.spec) if isinstance(self.spec, Steps) else dict(getattr(self.spec, "options", ()))


def step_kwargs(spec: Steps) -> dict[str, Any]:
    """A :class:`Steps` part's keyword arguments for ``bench_cases``: its counts, then its options."""
    counts = {k: v for k, v in (("warmup", spec.warmup), ("iters", spec.iters)) if v is not None}
    return {**counts, **dict(spec.options)}


@dataclass(frozen=True)
class ChapterPlan:
    """What a chapter measures on one device under one ``SMOKE`` value, in order, and its estimate."""

    chapter: str
    smoke: bool | str
    device: str
    parts: tuple[Planned, ...]

    @property
    def count(self) -> int:
        return sum(p.count for p in self.parts)

    @property
    def work_s(self) -> float:
        """The estimated seconds of every case, no budget applied."""
        return sum(p.work_s for p in self.parts)

    @property
    def estimate_s(self) -> float:
        """The estimated seconds, each part capped by its budget."""
        return sum(p.estimate_s for p in self.parts)

    def part(self, bench: str) -> Planned:
        for p in self.parts:
            if p.spec.bench == bench:
                return p
        raise ValueError(f"chapter {self.chapter}'s plan has no part {bench!r}")

    def announce(self) -> str:
        """'measuring N cases on <device>: about M min', then what the device leaves out and why."""
        what = ", ".join(f"{p.spec.bench} {p.count}" for p in self.parts)
        capped = ", capped by its budget" if self.estimate_s < self.work_s else ""
        lines = [f"measuring {self.count} cases on {self.device}: about {self.estimate_s / 60:.0f} min{capped} "
                 f"({what}; a first guess: compiling, then steps at the FLOP accounting's pace)"]
        lines += [f"  not measured here: {why}" for p in self.parts for why in p.skipped]
        return "\n".join(lines)


def _keep(cases: list[Case], info: DeviceInfo) -> tuple[list[Case], tuple[str, ...]]:
    """The cases the device runs as labelled, and each distinct reason for those it does not."""
    kept, why = [], {}
    for c in cases:
        reason = case_why_not(info, c)
        if reason is None:
            kept.append(c)
        else:
            why.setdefault(f"{c.precision}: {reason}", None)
    return kept, tuple(why)


def _case_s(c: Case, info: DeviceInfo, steps: int, isolated: bool = False) -> float:
    fixed = DEFAULT_COST_S.get(c.mode, 60.0) + (PROCESS_START_S if isolated else 0.0)
    return fixed + steps * step_seconds(c.config, c.B, c.T, c.precision, info)


def step_cases(spec: Steps, gpu: bool) -> list[Case]:
    """A :class:`Steps` part's cases, every precision it names (the device's plan filters them)."""
    modes = list(spec.modes if gpu else spec.cpu_modes)
    if not spec.context_is_T:
        return make_cases(spec.configs(), spec.shapes, modes, spec.precisions)
    cases: list[Case] = []
    for B, T in spec.shapes:
        cases += make_cases(spec.configs(T), [(B, T)], modes, spec.precisions)
    return cases


def _plan_steps(spec: Steps, info: DeviceInfo, gpu: bool) -> Planned:
    cases, skipped = _keep(step_cases(spec, gpu), info)
    opts = {"warmup": DEFAULT_WARMUP, "iters": DEFAULT_ITERS, **step_kwargs(spec)}
    steps = opts["warmup"] + opts["iters"]
    isolate = set(opts.get("isolate_modes", ("compile-max",)))
    work = sum(_case_s(c, info, steps, c.mode in isolate) for c in cases)
    return Planned(spec, tuple(cases), len(cases), skipped, work)


def _plan_baselines(spec: Baselines, info: DeviceInfo, gpu: bool) -> Planned:
    if spec.smoke:  # as a smoke run always measured them: the suite shrunk, no precision filter
        cases = smoke_cases(baselines(), torch.device("cuda" if gpu else "cpu"))
        skipped: tuple[str, ...] = ()
        steps = 3 + 10  # ftlib.harness.suites.measure's smoke counts
    else:
        kw: dict[str, Any] = {"broadcast": spec.broadcast}
        if spec.precisions is not None:
            kw["precisions"] = spec.precisions
        if spec.configs is not None:
            kw["configs"] = spec.configs
        cases, skipped = _keep(baselines(**kw), info)
        steps = DEFAULT_WARMUP + DEFAULT_ITERS
    work = sum(_case_s(c, info, steps) for c in cases)
    return Planned(spec, tuple(cases), len(cases), skipped, work)


def _plan_profiles(spec: Profiles, info: DeviceInfo, gpu: bool) -> Planned:
    B, T = spec.shape
    modes = spec.modes if gpu else spec.cpu_modes
    precisions = spec.precisions if gpu else ("fp32",)  # on the CPU: fp32 only, as chapter 1 always did
    cases = [Case(name, preset(name, **dict(spec.size)), B, T, mode, prec)
             for name in spec.presets for mode in modes for prec in precisions]
    cases, skipped = _keep(cases, info)
    steps = spec.steps + spec.warmup + spec.timing_steps
    work = sum(_case_s(c, info, steps) + PROFILE_TRACE_S for c in cases)
    return Planned(spec, tuple(cases), len(cases), skipped, work)


def _run_s(cfg: ModelConfig, rec: Any, info: DeviceInfo) -> float:
    step = step_seconds(cfg, rec.batch_size, rec.block_size, rec.precision, info)
    evals = rec.steps // rec.eval_interval + 1
    fixed = DEFAULT_COST_S["compile"] if rec.compile else DEFAULT_COST_S["engine"] if rec.engine else 0.0
    return TRAIN_SETUP_S + fixed + rec.steps * step + evals * 2 * rec.eval_iters * step / 3


def _plan_training(spec: Training, info: DeviceInfo, gpu: bool) -> Planned:
    runs = spec.runs()
    work = sum(_run_s(cfg, rec, info) for _, cfg, rec, _ in runs)
    return Planned(spec, (), len(runs), (), work, spec.budget_s)


def _plan_kernels(spec: Kernels, info: DeviceInfo, gpu: bool) -> Planned:
    ops = spec.ops if gpu else spec.cpu_ops
    n = len(ops) if ops is not None else KERNEL_DRIVERS_ALL
    return Planned(spec, (), n, (), n * KERNEL_DRIVER_S + PROCESS_START_S, spec.budget_s)


_PLANNERS = {Steps: _plan_steps, Baselines: _plan_baselines, Profiles: _plan_profiles, Training: _plan_training,
             Kernels: _plan_kernels}


def chapter_plan(chapter: str, smoke: object, info: DeviceInfo, gpu: bool | None = None) -> ChapterPlan:
    """Chapter ``chapter``'s profile under ``smoke`` on the device ``info`` describes (``gpu``: whether
    the GPU modes run there; by default whether ``info`` is a GPU)."""
    smoke = normalise_smoke(smoke)
    gpu = info.kind == "cuda" if gpu is None else gpu
    label = info.label() + (f", rehearsed on {info.actual}" if info.rehearsal else "")
    parts = tuple(_PLANNERS[type(spec)](spec, info, gpu) for spec in profile(chapter, smoke))
    return ChapterPlan(chapter, smoke, label, parts)


def plan_here(chapter: str, smoke: object, device: torch.device) -> ChapterPlan:
    """The plan on ``device`` (``DeviceInfo.detect``, so ``FTLIB_CAPABILITY`` rehearses another GPU).

    The T4 profile measures full-size models on a GPU: on a CPU it is refused (unless a GPU is
    rehearsed), since it would run for hours there.
    """
    smoke = normalise_smoke(smoke)
    info = DeviceInfo.detect(device)
    if smoke == "t4" and info.kind != "cuda":
        raise ValueError("SMOKE='t4' measures the post's models at full size on a GPU, and this is a CPU: "
                         "use SMOKE=True (small models) here, or a GPU runtime")
    return chapter_plan(chapter, smoke, info, gpu=info.kind == "cuda" if smoke == "t4" else device.type == "cuda")


def run_plan(plan: ChapterPlan, device: torch.device) -> dict[str, list[dict[str, Any]]]:
    """Measure every part of ``plan`` on ``device``, in order; the rows measured now, per results file."""
    from ftlib.harness.suites import measure

    out: dict[str, list[dict[str, Any]]] = {}
    for p in plan.parts:
        spec = p.spec
        if isinstance(spec, Baselines):
            rows = measure(p.cases, spec.bench, device, smoke=spec.smoke, **p.kwargs)
        elif isinstance(spec, Steps):
            rows = bench_cases(p.cases, ResultStore(spec.bench, device_slug(device)), False, device=device,
                               **p.kwargs)
        elif isinstance(spec, Profiles):
            rows = _run_profiles(p, device)
        elif isinstance(spec, Training):
            from ftlib.harness.convergence import run_suites

            rows = run_suites(spec.suites, device, smoke=spec.tiny, budget_s=spec.budget_s)
        else:
            rows = _run_kernels(spec, device)
        out[spec.bench] = rows
    return out


def _run_profiles(p: Planned, device: torch.device) -> list[dict[str, Any]]:
    from ftlib.harness.profiling import profile_suite

    spec = p.spec
    assert isinstance(spec, Profiles)
    counts = dict(steps=spec.steps, warmup=spec.warmup, timing_steps=spec.timing_steps)
    rows: list[dict[str, Any]] = []
    for c in p.cases:  # in profile_suite's order: presets, modes, precisions
        rows += profile_suite([c.label], [c.mode], [c.precision], c.B, c.T, device, store=True, **counts,
                              **dict(spec.size))
    return rows


def _run_kernels(spec: Kernels, device: torch.device) -> list[dict[str, Any]]:
    """The kernel benchmarks, a program of their own (ftlib does not import them), from the repository root."""
    ops = spec.ops if device.type == "cuda" else spec.cpu_ops
    args = ["--ops", ",".join(ops)] if ops is not None else []
    if spec.budget_s is not None:
        args += ["--budget-s", f"{spec.budget_s:.0f}"]
    subprocess.run([sys.executable, "-m", "benchmarks.kernels.suite", "--device", str(device), "--cpu-reps",
                    str(spec.cpu_reps), *args], cwd=repo_root(), check=True)
    return []
