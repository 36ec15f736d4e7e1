"""Reading stored benchmark rows for the chapters: filter, pick, describe their provenance."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any

from ftlib.analysis.peaks import PEAKS
from ftlib.core.device import slug_of_name
from ftlib.harness.results import load_rows

MODE_NAMES = {
    "eager": "eager",
    "cudagraph": "whole-step CUDA graph",
    "compile": "torch.compile (default)",
    "compile-ro": "torch.compile (reduce-overhead)",
    "compile-max": "torch.compile (max-autotune-no-cudagraphs)",
    "engine": "ftlib engine (our kernels, flat buffers, one CUDA graph)",
}

# The models as the book names them, by the preset keys the rows store.
MODEL_NAMES = {"gpt2": "GPT-2", "fasttransformer": "FastTransformer",
               "fasttransformer-broadcast": "FastTransformer, K/V as (B, 1, T, d)"}
_TITLES = {**MODEL_NAMES, "nanogpt-char": "nanoGPT shakespeare_char"}
# A preset key as a whole word of a stored name: 'gpt2 + MQA', 'gpt2 fuse_mlp_act=True', '+no bias = fasttransformer'.
_KEY = re.compile(r"(?<!\S)(" + "|".join(map(re.escape, sorted(_TITLES, key=len, reverse=True))) + r")(?=\s|$)")


def model_title(name: Any) -> Any:
    """'GPT-2 + MQA' for the rows' 'gpt2 + MQA': a stored model name with each preset key in it as the book
    names the model; any other value (a candidate's own name, a number) unchanged."""
    return _KEY.sub(lambda m: _TITLES[m.group(1)], name) if isinstance(name, str) else name


def ok_rows(bench: str | Iterable[str], include_cpu: bool = False) -> list[dict[str, Any]]:
    """Rows with status 'ok' of one or several benches, from every stored device folder."""
    benches = [bench] if isinstance(bench, str) else list(bench)
    return [r for b in benches for r in load_rows(b, include_cpu=include_cpu) if r.get("status") == "ok"]


def select(rows: Iterable[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    """Rows whose fields equal every ``match`` value (``label='gpt2', mode='eager'``)."""
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def pick(rows: Iterable[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    """The single row matching ``match`` (the latest by date if several), or None.

    For a row that stands alone (one configuration's stored step, one seed's curve); a number a
    reader compares across runs is their median over runs (:mod:`ftlib.views.per_run`).
    """
    found = sorted(select(rows, **match), key=lambda r: r.get("date", ""))
    return found[-1] if found else None


def devices(rows: Iterable[dict[str, Any]]) -> list[str]:
    return sorted({r["device_slug"] for r in rows})


NO_GPU = "no GPU rows"  # what a title or caption names where no device has rows


@functools.cache
def _known_folders() -> dict[str, str]:
    return {slug_of_name(name): name.removeprefix("NVIDIA ") for name in PEAKS}


def known_gpu(slug: str) -> str | None:
    """'H200' for the folder 'h200': the name CUDA reports, without the vendor, of a GPU the book knows
    (:data:`~ftlib.analysis.peaks.PEAKS`); None for any other folder."""
    return _known_folders().get(slug)


def gpu_label(slug: str | None, keep_unknown: bool = False) -> str:
    """'H200', 'H100 80GB HBM3': :func:`known_gpu` of the folder ``slug``; any other folder in capitals ('CPU'),
    or as written with ``keep_unknown`` (a table's cell that may already be a name, such as 'Tesla T4'). A
    reader's own rows keep their tag: 'h200 (this run)' -> 'H200 (this run)'. No folder (a chapter with no
    stored rows at all) reads 'no GPU rows'."""
    if slug is None:
        return NO_GPU
    base, sep, tag = slug.partition(" (")
    return (known_gpu(base) or (base if keep_unknown else base.upper())) + sep + tag


def gpu_name(name: str | None, slug: str) -> str:
    """'H100 80GB HBM3': a GPU as CUDA names it, without the vendor; :func:`gpu_label` of its folder where no
    row names it."""
    return name.removeprefix("NVIDIA ") if name else gpu_label(slug)


def gpu_of(rows: Iterable[dict[str, Any]], slug: str) -> str:
    """:func:`gpu_name` of the GPU whose folder ``slug`` holds ``rows`` (a row's ``device``, or its
    provenance's)."""
    names = (r.get("device") or (r.get("provenance") or {}).get("device") for r in rows
             if r.get("device_slug") == slug)
    return gpu_name(next((n for n in names if n), None), slug)


def provenance_line(rows: Iterable[dict[str, Any]]) -> str:
    """'NVIDIA H200, torch 2.11.0, 2026-12-02, commit abc' for each distinct source of ``rows``."""
    keys = sorted({(r.get("device"), r.get("torch"), str(r.get("date", ""))[:10], r.get("commit")) for r in rows})
    return "; ".join(f"{d}, torch {t}, {day}, commit {c}" for d, t, day, c in keys)


def provenance_short(rows: Iterable[dict[str, Any]], most: int = 2) -> str:
    """:func:`provenance_line` where ``rows`` come from at most ``most`` sources; else, per GPU and torch
    version, how many commits and the dates they span: 'NVIDIA H200, torch 2.11.0, 12 commits, 2026-12-02
    to 2026-12-04'."""
    rows = list(rows)
    keys = {(r.get("device"), r.get("torch"), str(r.get("date", ""))[:10], r.get("commit")) for r in rows}
    if len(keys) <= most:
        return provenance_line(rows)
    out = []
    for d, t in sorted({(d, t) for d, t, _, _ in keys}, key=str):
        days = sorted({day for dd, tt, day, _ in keys if (dd, tt) == (d, t)})
        n = len({c for dd, tt, _, c in keys if (dd, tt) == (d, t)})
        span = days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"
        out.append(f"{d}, torch {t}, {n} commit{'s' if n != 1 else ''}, {span}")
    return "; ".join(out)


def not_measured(suites: str) -> str:
    """What a chapter says where a suite's rows are missing: the GPU command that measures them."""
    return f"not measured yet: bash ci/gpu-run --out OUT --only {suites}"


def same_config(row: dict[str, Any], cfg: Any, ignore: tuple[str, ...] = ("init",)) -> bool:
    """True if ``row`` measured ``cfg`` (a ModelConfig), fields in ``ignore`` aside.

    The init is ignored by default: it changes the weights' values, not the work of a step,
    so the ladder's last rung (GPT-2's init) and the FastTransformer preset time alike.
    Matching the whole config keeps smoke runs of smaller models out of the full-size views.
    """
    want, got = cfg.to_dict(), row.get("config") or {}
    return all(got.get(k) == v for k, v in want.items() if k not in ignore)
