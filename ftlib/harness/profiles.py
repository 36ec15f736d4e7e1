"""What each measuring chapter measures, per value of its ``SMOKE`` parameter: one declarative table.

A chapter's ``SMOKE`` takes one of three values (:func:`normalise_smoke`):

* ``True`` - small models at small shapes: a quick check of the code path, for CI and CPU runs.
  Its rows never stand in for the book's sizes (its models differ, so do its keys).
* ``'t4'`` - the T4 profile, what the Colab set-up cell chooses: the post's models at full size, in
  the precisions the device runs as labelled (:mod:`ftlib.harness.precision_plan`; fp32 and fp16 on
  a T4), with the cases cut to those that test the post's claims, so that a chapter measures in
  about ten minutes on a T4 (:mod:`ftlib.harness.plans` estimates it before measuring).
* ``False`` - everything the chapter's suites hold, at full size.

:data:`PROFILES` says, per chapter and value, which parts the chapter measures, each a small frozen
description: step benchmarks (:class:`Steps`), the baselines suite (:class:`Baselines`), profiles
(:class:`Profiles`), training studies (:class:`Training`) or the kernel benchmarks (:class:`Kernels`).
:mod:`ftlib.harness.plans` turns them into the cases for one device, estimates their time and runs
them. Nothing here measures or prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ftlib.core.precision import PRECISIONS
from ftlib.harness.bench.runners import STEP_MODES
from ftlib.harness.profiling import PROFILE_MODES
from ftlib.harness.studies import SUITE_ORDER, suites
from ftlib.harness.suites import HEADLINE_B, HEADLINE_T, SHARED_CACHE, STEP_CONFIGS, SUITES, TOKENS_PER_STEP, TSWEEP_T
from ftlib.model.ablations import grid
from ftlib.model.config import ModelConfig, preset

MODELS = ("gpt2", "fasttransformer")
SMOKE_VALUES: tuple[bool | str, ...] = (True, "t4", False)
MEASURING_CHAPTERS = ("01", "03", "04", "05", "06", "08")
FULL = (HEADLINE_B, HEADLINE_T)  # the post's benchmark shape
SMALL_SIZE = (("n_layer", 1), ("n_embd", 64))  # a smoke run's models in chapters 4 and 5
# Chapter 4 under the T4 profile: the cells that test the post's claims, each change alone and all four.
CLAIM_CELLS = ("gpt2", "MQA", "SDPA", "MLP2x", "RMS", "MQA+SDPA+MLP2x+RMS")
KERNEL_OPS_QUICK = ("ceilings", "rmsnorm", "cross_entropy")  # the ceilings and the two cheapest ops


def normalise_smoke(smoke: object) -> bool | str:
    """``smoke`` if it is one of :data:`SMOKE_VALUES` (True, 't4', False); a ValueError naming them otherwise."""
    if smoke is True or smoke is False or (isinstance(smoke, str) and smoke == "t4"):
        return smoke
    raise ValueError(f"SMOKE={smoke!r} is not one of True (small models: CI and CPU runs), 't4' (the post's "
                     "models at full size, about ten minutes a chapter on a T4) or False (every case at full size)")


def _check(where: str, bad: list[str]) -> None:
    if bad:
        raise ValueError(f"invalid {where}: " + "; ".join(bad))


def _check_modes(modes: tuple[str, ...], allowed: tuple[str, ...], name: str, bad: list[str]) -> None:
    unknown = [m for m in modes if m not in allowed]
    if unknown:
        bad.append(f"{name} {unknown} are not among {allowed}")


def _check_precisions(precisions: tuple[str, ...], bad: list[str]) -> None:
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        bad.append(f"precisions {unknown} are not among {PRECISIONS}")


def _check_counts(counts: Mapping[str, int | None], bad: list[str]) -> None:
    for name, v in counts.items():
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            bad.append(f"{name}={v!r} must be a non-negative int (or None: the runner's default)")


def _check_shape(shape: tuple[int, int], bad: list[str]) -> None:
    if len(shape) != 2 or not all(isinstance(x, int) and x > 0 for x in shape):
        bad.append(f"shape {shape!r} must be two positive ints (B, T)")


@dataclass(frozen=True)
class Steps:
    """Step benchmarks (:func:`ftlib.harness.bench.cases.bench_cases`) written to ``<bench>.jsonl``.

    ``models``: 'presets' (GPT-2 and the FastTransformer) or 'grid' (chapter 4's cells, ``cells``
    of them, all 16 when None). ``size``: config fields of small models (empty: full size).
    ``context_is_T``: each model's context is its T (the T sweep). ``warmup``/``iters`` None: the
    benchmark's defaults. ``options``: more keyword arguments of ``bench_cases``.
    """

    bench: str
    models: str
    shapes: tuple[tuple[int, int], ...]
    modes: tuple[str, ...]
    cpu_modes: tuple[str, ...] = ("eager",)
    precisions: tuple[str, ...] = ("fp32",)
    size: tuple[tuple[str, Any], ...] = ()
    cells: tuple[str, ...] | None = None
    context_is_T: bool = False
    warmup: int | None = None
    iters: int | None = None
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        bad: list[str] = []
        if self.models not in ("presets", "grid"):
            bad.append(f"models={self.models!r} is not 'presets' or 'grid'")
        if self.cells is not None and (self.models != "grid" or not set(self.cells) <= set(grid())):
            bad.append(f"cells {self.cells} must be chapter 4's grid cells ({sorted(grid())})")
        if not self.shapes:
            bad.append("no shapes")
        for s in self.shapes:
            _check_shape(s, bad)
        _check_modes(self.modes, STEP_MODES, "modes", bad)
        _check_modes(self.cpu_modes, STEP_MODES, "cpu_modes", bad)
        _check_precisions(self.precisions, bad)
        _check_counts({"warmup": self.warmup, "iters": self.iters}, bad)
        _check(f"Steps({self.bench!r})", bad)

    def sized(self, configs: Mapping[str, ModelConfig]) -> dict[str, ModelConfig]:
        """``configs`` at this part's model size."""
        return {k: v.replace(**dict(self.size)) for k, v in configs.items()}

    def configs(self, T: int | None = None) -> dict[str, ModelConfig]:
        """The models measured (at sequence length ``T`` where the context is T): label -> config."""
        if self.models == "grid":
            cells = self.sized(grid())
            return {k: cells[k] for k in self.cells or cells}
        ctx = {"block_size": T} if self.context_is_T and T is not None else {}
        return {m: preset(m, **ctx, **dict(self.size)) for m in MODELS}

    @property
    def tokens(self) -> int:
        """Tokens per step of the first shape (the T sweep's fixed B x T)."""
        B, T = self.shapes[0]
        return B * T

    @property
    def Ts(self) -> tuple[int, ...]:
        return tuple(T for _, T in self.shapes)


@dataclass(frozen=True)
class Baselines:
    """Cases of the baselines suite (:func:`ftlib.harness.suites.baselines`), measured as one run.

    ``smoke``: the suite shrunk to small models (:func:`ftlib.harness.suites.smoke_cases`). Else
    ``precisions`` and ``configs`` ((mode, optimizer) pairs) select the suite's cases, None: all.
    """

    precisions: tuple[str, ...] | None = None
    configs: tuple[tuple[str, str], ...] | None = None
    broadcast: bool = True
    smoke: bool = False
    options: tuple[tuple[str, Any], ...] = ()
    bench: str = "baselines"

    def __post_init__(self) -> None:
        bad: list[str] = []
        _check_precisions(self.precisions or (), bad)
        unknown = [c for c in self.configs or () if c not in STEP_CONFIGS]
        if unknown:
            bad.append(f"configs {unknown} are not in the suite's STEP_CONFIGS")
        if self.smoke and (self.precisions or self.configs):
            bad.append("a smoke selection takes the whole suite shrunk: no precisions or configs")
        _check("Baselines", bad)


@dataclass(frozen=True)
class Profiles:
    """Chapter 1's profiles (:func:`ftlib.harness.profiling.profile_suite`) of both presets."""

    shape: tuple[int, int]
    precisions: tuple[str, ...]
    steps: int
    warmup: int
    timing_steps: int
    size: tuple[tuple[str, Any], ...] = ()
    modes: tuple[str, ...] = PROFILE_MODES
    cpu_modes: tuple[str, ...] = ("eager",)
    presets: tuple[str, ...] = MODELS
    bench: str = "profile"

    def __post_init__(self) -> None:
        bad: list[str] = []
        _check_shape(self.shape, bad)
        _check_precisions(self.precisions, bad)
        _check_modes(self.modes, PROFILE_MODES, "modes", bad)
        _check_modes(self.cpu_modes, PROFILE_MODES, "cpu_modes", bad)
        _check_counts({"steps": self.steps, "warmup": self.warmup, "timing_steps": self.timing_steps}, bad)
        if not self.timing_steps:
            bad.append("timing_steps must be at least 1")
        _check("Profiles", bad)


@dataclass(frozen=True)
class Training:
    """Chapter 8's training studies (:func:`ftlib.harness.convergence.run_suites`), ``tiny``: smoke size."""

    suites: tuple[str, ...]
    tiny: bool
    budget_s: float = 600.0
    bench: str = "convergence"

    def __post_init__(self) -> None:
        bad: list[str] = []
        unknown = [s for s in self.suites if s not in SUITE_ORDER]
        if unknown or not self.suites:
            bad.append(f"suites {list(self.suites)} must be a non-empty selection of {SUITE_ORDER}")
        if not self.budget_s > 0:
            bad.append(f"budget_s={self.budget_s} must be positive")
        _check("Training", bad)

    def runs(self) -> list[tuple[str, Any, Any, int]]:
        """(suite, config, recipe, seed) of every run the studies list (a speedrun's extra seeds aside)."""
        table = suites(self.tiny)
        return [(name, cfg, rec.replace(seed=seed), seed) for name in self.suites
                for seed in table[name]["seeds"] for cfg, rec in table[name]["runs"].values()]


@dataclass(frozen=True)
class Kernels:
    """Chapter 6's kernel benchmarks (``python -m benchmarks.kernels.suite``): ``ops`` on a GPU (None:
    every driver), ``cpu_ops`` on a CPU (the Triton interpreter at tiny sizes)."""

    ops: tuple[str, ...] | None
    cpu_ops: tuple[str, ...] | None = None
    cpu_reps: int = 1
    budget_s: float | None = None
    bench: str = "kernels"

    def __post_init__(self) -> None:
        bad: list[str] = []
        if self.ops is not None and not self.ops:
            bad.append("ops is empty (None: every driver)")
        if self.cpu_reps < 1:
            bad.append(f"cpu_reps={self.cpu_reps} must be >= 1")
        if self.budget_s is not None and not self.budget_s > 0:
            bad.append(f"budget_s={self.budget_s} must be positive")
        _check("Kernels", bad)


Part = Steps | Baselines | Profiles | Training | Kernels
SMOKE_COUNTS = dict(warmup=3, iters=10)  # a smoke run's step counts
# The T4 profile: fewer timed steps where compiling dominates anyway; chapter 1 in the post's modes
# (eager, the whole step as one CUDA graph, reduce-overhead); the baselines configurations the
# chapters' claims are read from (the post's reduce-overhead with AdamW left eager, eager for the
# inversion, the CUDA graph and compile for the ceiling, the engine); the T sweep at the post's
# stated T and its benchmark T.
T4_WARMUP, T4_ITERS = 5, 20
T4_PROFILE_MODES = ("eager", "cudagraph", "compile-ro")
T4_CONFIGS_03 = (("eager", "default"), ("cudagraph", "fused"), ("compile", "default"), ("compile-ro", "default"),
                 ("compile-ro", "fused"), ("engine", "default"))
T4_CONFIGS_05 = (("eager", "default"), ("compile-ro", "default"), ("engine", "default"))
T4_SWEEP_T = tuple(T for T in TSWEEP_T if T in (128, HEADLINE_T))


def _sweep(tokens: int, Ts: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((tokens // T, T) for T in Ts)


def _opts(options: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(options.items())


PROFILES: dict[str, dict[bool | str, tuple[Part, ...]]] = {
    "01": {
        True: (Profiles((4, 64), ("fp32",), steps=2, warmup=2, timing_steps=5, size=(("n_layer", 2),)),),
        "t4": (Profiles(FULL, PRECISIONS, steps=3, warmup=3, timing_steps=20, modes=T4_PROFILE_MODES),),
        False: (Profiles(FULL, ("fp32", "tf32", "bf16"), steps=5, warmup=5, timing_steps=50),),
    },
    "03": {
        True: (Baselines(smoke=True),),
        "t4": (Baselines(("fp32",), T4_CONFIGS_03, broadcast=False, options=_opts(SHARED_CACHE)),),
        False: (Baselines(),),
    },
    "04": {
        True: (Steps("grid", "grid", ((4, 64),), ("eager", "cudagraph"), size=SMALL_SIZE, **SMOKE_COUNTS),),
        "t4": (Steps("grid", "grid", (FULL,), ("eager", "cudagraph"), cells=CLAIM_CELLS, warmup=T4_WARMUP,
                     iters=T4_ITERS),
               Steps("grid_compile", "grid", (FULL,), ("compile-ro",), cpu_modes=(), cells=CLAIM_CELLS,
                     warmup=T4_WARMUP, iters=T4_ITERS, options=_opts(SHARED_CACHE))),
        False: (Steps("grid", "grid", (FULL,), ("eager", "cudagraph")),),
    },
    "05": {
        True: (Baselines(smoke=True),
               Steps("tsweep", "presets", _sweep(256, (32, 64)), ("eager", "compile-ro"), size=SMALL_SIZE,
                     context_is_T=True, **SMOKE_COUNTS)),
        "t4": (Steps("tsweep", "presets", _sweep(TOKENS_PER_STEP, T4_SWEEP_T), ("eager", "compile-ro"),
                     context_is_T=True, warmup=T4_WARMUP, iters=T4_ITERS, options=_opts(SHARED_CACHE)),
               Steps("compile_time", "presets", (FULL,), ("compile-ro",), cpu_modes=(),
                     options=_opts(SUITES["compile_time"].options)),
               Baselines(("fp16",), T4_CONFIGS_05, broadcast=False, options=_opts(SHARED_CACHE))),
        False: (Baselines(),
                Steps("tsweep", "presets", _sweep(TOKENS_PER_STEP, TSWEEP_T), ("eager", "compile-ro"),
                      context_is_T=True)),
    },
    "06": {
        True: (Kernels(KERNEL_OPS_QUICK),),
        "t4": (Kernels(KERNEL_OPS_QUICK),),
        False: (Kernels(None),),
    },
    "08": {
        True: (Training(SUITE_ORDER, tiny=True),),
        "t4": (Training(("convergence-original",), tiny=False),),
        False: (Training(SUITE_ORDER, tiny=False),),
    },
}


def profile(chapter: str, smoke: object) -> tuple[Part, ...]:
    """The parts chapter ``chapter`` measures under ``smoke``, in order (a ValueError for an unknown
    chapter or value)."""
    if chapter not in PROFILES:
        raise ValueError(f"chapter {chapter!r} measures nothing; the measuring chapters are {MEASURING_CHAPTERS}")
    return PROFILES[chapter][normalise_smoke(smoke)]


def part(chapter: str, smoke: object, bench: str) -> Part:
    """The part of ``profile(chapter, smoke)`` that writes ``bench``."""
    for p in profile(chapter, smoke):
        if p.bench == bench:
            return p
    raise ValueError(f"chapter {chapter} measures no {bench!r} under SMOKE={smoke!r}")


def view_smoke(smoke: object, measure: bool) -> bool | str:
    """Which profile's sizes a chapter's views read: its own when it measures here, else the full size."""
    smoke = normalise_smoke(smoke)
    return smoke if measure else False


def rows_device(smoke: object, measure: bool, here: str) -> str | None:
    """Whose stored rows a chapter's views read: device folder ``here`` when it measures small models or
    every case (SMOKE True or False), else (None) every GPU's, grouped by device: without measuring, and
    under the T4 profile, whose rows sit in this GPU's folder beside the stored ones."""
    return here if measure and normalise_smoke(smoke) != "t4" else None


def checkpoint_smoke(smoke: object) -> bool:
    """Whether chapter 8's checkpoint round trip trains a tiny model: unless SMOKE=False. The T4 profile
    keeps it tiny: the speedrun's winner is a bf16 engine model, and a T4's minutes go to the post's
    own experiment."""
    return normalise_smoke(smoke) is not False
