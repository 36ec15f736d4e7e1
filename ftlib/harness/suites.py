"""The catalogue of measuring suites: which step benchmarks the book stores, and in what order.

Each suite is a list of :class:`ftlib.harness.bench.Case` plus how to run it. ``ci/gpu_bench.py`` runs
them on a GPU; the chapters read their rows back through the views. Every row a suite writes
carries the run it came from (``run_id``: one process) and that run's place in its key, so
each call measures its suites afresh and a view pairs rows of one run only (see
``ftlib.views.baselines``).

Suites:

* ``baselines`` - the book's headline comparison, both models in fp32, tf32 and bf16 at B=32,
  T=256: eager, the manual whole-step CUDA graph, ``torch.compile`` default and
  reduce-overhead with the optimizer in each place a careful user puts it (PyTorch's default
  AdamW run eagerly, fused AdamW, the whole step compiled), and the engine. Repeated in
  several fresh processes on several machine starts: its ratios are shown with their spread.
* ``tsweep``, ``compile_time``, ``compile_max``, ``grid``, ``ladder``, ``grid_compile`` - the
  post's own experiments (sequence sweep, first-step time, the four changes alone and
  together) in the post's execution modes.
* ``engine`` - the engine with each of its kernels and fusions switched off in turn.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ftlib.core.device import device_slug
from ftlib.core.repo import repo_root
from ftlib.harness.bench.cases import (  # noqa: F401 (the headline shape, re-exported where it was)
    HEADLINE_B,
    HEADLINE_PRECISIONS,
    HEADLINE_T,
    Case,
    bench_cases,
    headline_first,
    headline_models,
    make_cases,
)
from ftlib.harness.bench.runners import WHOLE_STEP
from ftlib.harness.engine_suites import (  # noqa: F401 (re-exported: the engine's suites' pieces)
    BIAS_OPTIONS_OFF,
    CANDIDATES,
    engine_candidates,
    engine_variants,
)
from ftlib.harness.provenance import run_id
from ftlib.harness.results import ResultStore
from ftlib.model.config import preset

TOKENS_PER_STEP = 8192  # the original T sweep's fixed tokens per step
TSWEEP_T = (128, 256, 512, 1024, 2048, 4096)  # the original's 128..1024, then longer contexts

# Where the optimizer runs, per execution mode, in the baselines suite (ftlib.harness.bench.step's docstring
# explains each). The manual CUDA graph always captures the fused, capturable AdamW; the engine
# brings its own flat AdamW.
STEP_CONFIGS: tuple[tuple[str, str], ...] = (
    ("eager", "default"), ("eager", "fused"), ("cudagraph", "fused"),
    ("compile", "default"), ("compile", "fused"), ("compile", "whole-step"),
    ("compile-ro", "default"), ("compile-ro", "fused"), ("compile-ro", "whole-step"),
    ("engine", "default"),
)
# Configurations that joined the suite after runs were stored without them, in the groups they came in:
# each group's cases are appended after the earlier ones (earlier cases keep their order and keys), and a
# run without them is still complete (ftlib.views.baselines.complete_runs). Compiled autograd: the whole
# step with its backward traced into a graph too. Then the compiled step captured by hand as one CUDA
# graph, fused AdamW inside, so no host work is left between the compiler's kernels
# (ftlib.harness.bench.step's docstring).
LATER_STEP_GROUPS: tuple[tuple[tuple[str, str], ...], ...] = (
    (("compile", "whole-step-ca"), ("compile-ro", "whole-step-ca")),
    (("compile", "graphed"),),
)
LATER_STEP_CONFIGS: tuple[tuple[str, str], ...] = tuple(c for group in LATER_STEP_GROUPS for c in group)
# The FastTransformer with K/V passed as (B, 1, T, d), as the original code does; only in fp32,
# where that layout decides which SDPA kernel runs (chapter 1).
BROADCAST_CONFIGS: tuple[tuple[str, str], ...] = (
    ("eager", "default"), ("cudagraph", "fused"), ("compile", "default"),
    ("compile-ro", "default"), ("compile-ro", "fused"), ("compile-ro", "whole-step"),
)


@dataclass(frozen=True)
class Suite:
    """A named list of cases and options for ``bench_cases``; rows go to ``<name>.jsonl``."""

    name: str
    make: Callable[[], list[Case]]
    about: str
    options: Mapping = field(default_factory=dict)
    default: bool = False  # run when no suite is named
    # The order a run measures the cases in, where it is not the list's (which keeps the keys' catalogue).
    measure_order: Callable[[list[Case]], list[Case]] | None = None

    def cases(self) -> list[Case]:
        return self.make()

    def in_measuring_order(self, cases: list[Case]) -> list[Case]:
        return list(cases) if self.measure_order is None else self.measure_order(list(cases))


def baselines(models: Mapping | None = None, precisions: Sequence[str] = HEADLINE_PRECISIONS,
              shape: tuple[int, int] = (HEADLINE_B, HEADLINE_T),
              configs: Sequence[tuple[str, str]] | None = None, broadcast: bool = True) -> list[Case]:
    """Every model x precision in every (mode, optimizer) of ``configs``, one (model, precision) at a time;
    None: ``STEP_CONFIGS``, then each group of ``LATER_STEP_GROUPS`` after every earlier case.

    bf16 first, the precision the book's headline is about. A run measures them in
    :func:`ftlib.harness.bench.cases.headline_first`'s order: each (model, precision) in one piece (the later
    groups' configurations with it), the engine and the strongest compiled configurations first.
    """
    models = dict(models or headline_models())
    later = LATER_STEP_GROUPS if configs is None else ()
    configs = STEP_CONFIGS if configs is None else configs
    B, T = shape
    # fp16's loss scaler is not compiled into a step (ftlib.harness.bench.runners): no whole-step fp16 case.
    cases = [Case(label, cfg, B, T, mode, prec, optimizer=opt)
             for prec in precisions for label, cfg in models.items() for mode, opt in configs
             if not (prec == "fp16" and opt in WHOLE_STEP)]
    if broadcast and "fp32" in precisions and "fasttransformer" in models:
        bc = models["fasttransformer"].replace(kv_layout="broadcast")
        cases += [Case("fasttransformer-broadcast", bc, B, T, mode, "fp32", optimizer=opt)
                  for mode, opt in BROADCAST_CONFIGS]
    cases += [Case(label, cfg, B, T, mode, prec, optimizer=opt)
              for group in later for prec in precisions for label, cfg in models.items() for mode, opt in group
              if not (prec == "fp16" and opt in WHOLE_STEP)]
    return cases


def tsweep() -> list[Case]:
    """T from 128 to 4096 at 8,192 tokens per step (B = 8192 // T); block_size = T so T fits.

    In the order the book needs them: fp32 compile-ro first (the post's Figure 5 and its T=128
    claim), then tf32 compile-ro, then eager fp32 and tf32; T ascending, both models at each T.
    """
    cases: list[Case] = []
    for mode, prec in (("compile-ro", "fp32"), ("compile-ro", "tf32"), ("eager", "fp32"), ("eager", "tf32")):
        for T in TSWEEP_T:
            configs = {name: preset(name, block_size=T) for name in ("gpt2", "fasttransformer")}
            cases += make_cases(configs, [(TOKENS_PER_STEP // T, T)], [mode], [prec])
    return cases


def compile_time() -> list[Case]:
    """First step from a cold process and empty compile caches (fp32), the post's claim first.

    compile-ro (the claim), then compile default, then the manual CUDA graph (no compiler:
    what a first step costs without one). Each case is a fresh process.
    """
    models = {"gpt2": "gpt2", "fasttransformer": "fasttransformer"}
    return [c for mode in ("compile-ro", "compile", "cudagraph")
            for c in make_cases(models, [(HEADLINE_B, HEADLINE_T)], [mode], ["fp32"])]


def compile_max() -> list[Case]:
    """max-autotune (no CUDA graphs): may not finish; isolated with a time limit. Not run by default."""
    return make_cases({"gpt2": "gpt2", "fasttransformer": "fasttransformer"}, [(HEADLINE_B, HEADLINE_T)],
                      ["compile-max"], ["fp32"])


def grid() -> list[Case]:
    """Chapter 4: the 2^4 grid of the four switches, then the K/V-head and MLP-ratio sweeps.

    Eager and manual CUDA graph only (the compiled grid is its own suite); fp32, then tf32.
    """
    from ftlib.model.ablations import grid as grid_configs
    from ftlib.model.ablations import kv_head_sweep, mlp_ratio_sweep

    cases: list[Case] = []
    for prec in ("fp32", "tf32"):
        cases += make_cases(grid_configs(), [(HEADLINE_B, HEADLINE_T)], ["eager", "cudagraph"], [prec])
        cases += make_cases({**kv_head_sweep(), **mlp_ratio_sweep()}, [(HEADLINE_B, HEADLINE_T)],
                            ["eager", "cudagraph"], [prec])
    return cases


def ladder() -> list[Case]:
    """Chapter 4: the cumulative ladder GPT-2 -> FastTransformer under torch.compile(reduce-overhead)."""
    from ftlib.model.ablations import ladder as ladder_configs

    return make_cases(ladder_configs(), [(HEADLINE_B, HEADLINE_T)], ["compile-ro"], ["fp32"])


def grid_compile() -> list[Case]:
    """Chapter 4: the 16 grid cells compiled (reduce-overhead, fp32), beside the eager/cudagraph grid."""
    from ftlib.model.ablations import grid as grid_configs

    return make_cases(grid_configs(), [(HEADLINE_B, HEADLINE_T)], ["compile-ro"], ["fp32"])


# Suites whose compile time is not what they measure compile against shared caches
# (ftlib.harness.bench.step: cold_compile=False): kernels an earlier case built are not built again.
SHARED_CACHE = {"cold_compile": False}

SUITES: dict[str, Suite] = {s.name: s for s in (
    Suite("baselines", baselines, "both models, fp32/tf32/bf16/fp16, every mode and optimizer placement, and the "
          "engine (chapters 3, 5, 6, 7)", SHARED_CACHE, default=True, measure_order=headline_first),
    Suite("tsweep", tsweep, "T = 128..4096 at 8,192 tokens per step (chapter 5)", SHARED_CACHE, default=True),
    Suite("compile_time", compile_time, "first step from a cold process (chapter 5)",
          {"isolate_modes": ("compile", "compile-ro", "cudagraph"), "warmup": 3, "iters": 10}, default=True),
    Suite("compile_max", compile_max, "max-autotune, with a time limit (not run by default)",
          {"isolate_modes": ("compile-max",), "timeout_s": 420.0}),
    Suite("grid", grid, "the 2^4 grid and the K/V-head and MLP-ratio sweeps, eager and CUDA graph (chapter 4)"),
    Suite("ladder", ladder, "GPT-2 -> FastTransformer one change at a time, compiled (chapter 4)", SHARED_CACHE),
    Suite("grid_compile", grid_compile, "the 2^4 grid compiled (chapter 4)", SHARED_CACHE),
    Suite("engine", engine_variants, "the engine with each piece switched off (chapter 6)"),
    Suite("engine_candidates", engine_candidates, "engine options not yet defaults, each beside the default engine "
          "in the same run (chapter 6)"),
)}


# ---------------------------------------------------------------------------------------
# Measuring a suite from a chapter: one run, small models when it is a smoke run.

SMOKE_ROOT = repo_root() / "build" / "smoke-results"
SMOKE_SIZE = dict(n_layer=1, n_embd=64)  # a smoke run's models: the presets, one small block
SMOKE_SHAPE = (4, 64)
# What a smoke run of the baselines measures: one configuration per execution mode.
SMOKE_CONFIGS = (("eager", "default"), ("cudagraph", "fused"), ("compile-ro", "fused"), ("engine", "default"))


def with_run(cases: Sequence[Case], rid: str) -> list[Case]:
    """The cases keyed by run ``rid``: a new process measures them again instead of skipping them."""
    return [dataclasses.replace(c, extra={**c.extra, "run": rid}) for c in cases]


def smoke_cases(cases: Sequence[Case], device: torch.device) -> list[Case]:
    """The cases shrunk for a quick check: small models at a small shape, what ``device`` can run.

    The manual CUDA graph needs a GPU, and on a CPU only eager and the (uncaptured) engine are
    kept: compiling for the CPU takes long and says nothing about a GPU.
    """
    keep = {"eager", "engine"} if device.type != "cuda" else {m for m, _ in SMOKE_CONFIGS}
    out, seen = [], set()
    for c in cases:
        if (c.mode, c.optimizer) not in SMOKE_CONFIGS or c.mode not in keep:
            continue
        small = dataclasses.replace(c, config=c.config.replace(**SMOKE_SIZE, block_size=SMOKE_SHAPE[1]),
                                    B=SMOKE_SHAPE[0], T=SMOKE_SHAPE[1])
        if small.key("smoke") not in seen:
            seen.add(small.key("smoke"))
            out.append(small)
    return out


def measure(cases: Sequence[Case], bench: str, device: torch.device, smoke: bool | str, progress: bool = False,
            **bench_kwargs: Any) -> list[dict]:
    """Measure ``cases`` here as one run and return its rows (what a chapter measures, and its
    estimate, come from :mod:`ftlib.harness.plans`).

    A full-size run on a GPU (``smoke`` False, or 't4': the T4 profile) adds its rows to that GPU's
    results folder (or ``$FTLIB_MY_RESULTS``), beside the stored ones. A smoke run (``smoke=True``)
    writes where no chapter reads stored results (``build/smoke-results``), so small models never
    stand in for the book's sizes; CPU rows go to the ``cpu`` folder, which is not committed.
    """
    cases = smoke_cases(cases, device) if smoke is True else list(cases)
    root = SMOKE_ROOT if smoke is True else None
    store = ResultStore(bench, device_slug(device), root)
    kw = {"warmup": 3, "iters": 10} if smoke is True else {}
    return bench_cases(with_run(cases, run_id()), store, progress, device=device, **{**kw, **bench_kwargs})
