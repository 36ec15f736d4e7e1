"""Many measurements: cases of (config, B, T, mode, precision, optimizer), run resumably.

``bench_cases`` measures each case whose key a :class:`ftlib.harness.results.ResultStore` lacks
and writes each row as soon as it is measured, so a killed run resumes; ``bench_sweep`` is the
product of configs x shapes x modes x precisions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ftlib.core.device import device_slug, pick_device
from ftlib.core.progress import progress_bar
from ftlib.harness.bench.isolated import bench_step_isolated
from ftlib.harness.bench.runners import STEP_MODES, check_optimizer
from ftlib.harness.bench.step import bench_step, case_ident, key_extra, preset_of, resolve_config
from ftlib.harness.results import ResultStore, row_key
from ftlib.model.config import ModelConfig

HEADLINE_B, HEADLINE_T = 32, 256  # the original's benchmark shape
# fp16 last: it came to the suite after the others, and a run cut short keeps the first three.
HEADLINE_PRECISIONS = ("bf16", "tf32", "fp32", "fp16")


def headline_models() -> dict[str, ModelConfig]:
    """The two models every headline compares, by name: GPT-2 as written and the FastTransformer."""
    from ftlib.model.config import preset

    return {"gpt2": preset("gpt2"), "fasttransformer": preset("fasttransformer")}

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
        if self.mode not in STEP_MODES:
            raise ValueError(f"case {self.label!r}: unknown mode {self.mode!r}; expected one of {STEP_MODES}")
        if self.mode != "engine":
            check_optimizer(self.mode, self.optimizer)

    def key(self, bench: str) -> str:
        return row_key(bench, self.config.config_hash(), self.B, self.T, self.mode, self.precision,
                       key_extra(self.optimizer, self.extra))

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
        named = [(lbl, resolve_config(c)[0]) for lbl, c in configs.items()]
    else:
        named = [(c if isinstance(c, str) else (preset_of(c) or c.config_hash()), resolve_config(c)[0])
                 for c in configs]
    shapes, modes, precisions = list(shapes), list(modes), list(precisions)
    return [Case(lbl, cfg, B, T, m, p) for lbl, cfg in named for B, T in shapes for p in precisions
            for m in modes]


# Rough seconds a case takes when nothing is known yet (compile dominates), for budgeting.
DEFAULT_COST_S = {"eager": 10.0, "cudagraph": 15.0, "compile": 60.0, "compile-ro": 60.0, "compile-max": 120.0,
                  "engine": 20.0}


# Per (model, precision), what a baselines run measures first: the engine and the compiled configurations that
# have been the strongest baseline (chapter 6), so that a run stopped by its budget still holds the pair a
# headline ratio divides; the rest follow in the suite's order.
HEADLINE_FIRST: tuple[tuple[str, str], ...] = (
    ("engine", "default"), ("compile", "graphed"), ("compile-ro", "whole-step"), ("compile-ro", "fused"),
    ("compile-ro", "default"),
)


def headline_first(cases: list[Case]) -> list[Case]:
    """``cases`` grouped by (label, precision) in the order the groups first appear, each group's
    ``HEADLINE_FIRST`` configurations leading it; otherwise the list's order (a stable sort). The configurations
    of a (model, precision) are then measured one after another, later groups included, so a slow drift of the
    machine touches them alike."""
    groups: dict[tuple[str, str], int] = {}
    for c in cases:
        groups.setdefault((c.label, c.precision), len(groups))
    lead = {cfg: i for i, cfg in enumerate(HEADLINE_FIRST)}
    return sorted(cases, key=lambda c: (groups[(c.label, c.precision)], lead.get((c.mode, c.optimizer), len(lead))))


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


