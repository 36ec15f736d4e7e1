"""Chapter 3 in words: the compiler ceiling per GPU (what each execution mode buys over eager), compiled autograd
against the same whole step, and the chapter's closing paragraph, from :mod:`ftlib.views.baselines`' per-run
computations."""

from __future__ import annotations

import pandas as pd

from ftlib.analysis.claims import POST_CLAIMED
from ftlib.views.baseline_report import MODEL_KEYS, NO_RUNS
from ftlib.views.baselines import (
    BASELINE_CONFIGS,
    CONFIG_NAMES,
    POST_CONFIG,
    config_name,
    engine_note,
    engine_table,
    lookup_row,
    model_speedups,
    newest_engine,
    placement_table,
    range_text,
    runs_on_starts,
    spread,
    valid_rows,
    verdict,
    verdict_word,
)
from ftlib.views.bench import MODEL_NAMES, gpu_label

# The order chapter 3 and the closing chapter read a device's ceiling in: the post's precision (fp32) first.
CEILING_ORDER = ("fp32", "tf32", "bf16", "fp16")


def ceiling_precision(df: pd.DataFrame, device: str, precision: str = "fp32") -> str | None:
    """``precision`` where ``device``'s runs in ``df`` measured it, else the first of :data:`CEILING_ORDER` they
    did (None where they measured none): the precision chapter 3 reads a device's ceiling in."""
    have = set(df.loc[df["device_slug"] == device, "precision"])
    return next((p for p in (precision, *CEILING_ORDER) if p in have), None)


def chapter3_findings(df: pd.DataFrame, precision: str = "fp32") -> str:
    """Chapter 3's closing paragraph, per device, from the runs in ``df``: in ``precision`` (or, for a device
    without runs in it, the precision :func:`ceiling_precision` picks) the two models' ratio, the ceiling and
    the engine; then compiled autograd in each precision, under a heading of its own."""
    if df.empty:
        return NO_RUNS
    tab = spread(model_speedups(df), MODEL_KEYS)
    eng = newest_engine(engine_table(df))
    parts = []
    for dev in sorted(set(df["device_slug"])):
        prec = ceiling_precision(df, dev, precision)
        runs = df[(df["device_slug"] == dev) & (df["precision"] == prec)]
        # Per model where the two differ: some runs measured one model alone.
        each = {MODEL_NAMES[label]: runs_on_starts(g["run_id"].nunique(), g["machine_id"].nunique())
                for label, g in runs.groupby("label", sort=False) if label in MODEL_NAMES}
        n = (next(iter(each.values())) if len(set(each.values())) == 1
             else ", ".join(f"{name} {text}" for name, text in sorted(each.items(), reverse=True)))
        lines = [f"**{gpu_label(dev)}** ({prec}: {n}):" if prec == precision
                 else f"**{gpu_label(dev)}** (no {precision} runs; {prec}: {n}):"]
        post = lookup_row(tab, device_slug=dev, precision=prec, config=config_name(*POST_CONFIG))
        best = lookup_row(tab, device_slug=dev, precision=prec, config="strongest baseline of each")
        if post is not None:
            claim = (f"; the post claims {POST_CLAIMED['speedup_compiled']:.4g}× on a T4, in fp32"
                     if prec == "fp32" else "")
            lines.append(f"- Under the post's configuration ({config_name(*POST_CONFIG)}), FastTransformer steps "
                         f"{range_text(post['median'], post['min'], post['max'])} faster than GPT-2 "
                         f"({verdict_phrase(post['verdict'])}){claim}.")
        if best is not None:
            lines.append(f"- With each model at its fastest compiled configuration the ratio is "
                         f"{range_text(best['median'], best['min'], best['max'])} ({best['verdict']}).")
        lines += [f"- {s}" for s in ceiling_findings(df, dev, prec)]
        for label in ("gpt2", "fasttransformer"):
            e = lookup_row(eng, device_slug=dev, label=label, precision=prec)
            if e is not None:
                lines.append(f"- The book's engine for {MODEL_NAMES[label]} against that fastest compiled step: "
                             f"{range_text(e['median'], e['min'], e['max'])} ({e['verdict']})"
                             f"{engine_note(e['engine_config'])}.")
        ca = compiled_autograd_findings(df, dev)
        if ca:
            lines += ["", f"Compiled autograd on the {gpu_label(dev)}, each precision, in the runs that measured "
                      "the whole step compiled both with and without it:"] + [f"- {s}" for s in ca]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def verdict_phrase(word: str) -> str:
    """'verdict: slower'; a verdict that is itself the lack of one ('no verdict: the runs disagree') as it is."""
    return word if word.startswith("no verdict") else f"verdict: {word}"


def compiled_autograd_findings(df: pd.DataFrame, device: str, mode: str = "compile-ro") -> list[str]:
    """Compiled autograd against the same whole step without it, per model and precision, in the runs
    that measured both (a ratio per run, then its median and range over runs)."""
    v = valid_rows(df).query("device_slug == @device and mode == @mode")
    v = v[v["optimizer_kind"].isin(["whole-step", "whole-step-ca"])]
    if v.empty:
        return []
    wide = v.pivot_table(index=["label", "precision", "run_id"], columns="optimizer_kind", values="median_ms",
                         aggfunc="first")
    if not {"whole-step", "whole-step-ca"} <= set(wide.columns):
        return []
    wide = wide.dropna()
    graphs, out = v[v["optimizer_kind"] == "whole-step-ca"].groupby(["label", "precision"]), []
    for (label, prec), g in wide.groupby(level=["label", "precision"]):
        if label not in MODEL_NAMES:
            continue
        ratio, rows = g["whole-step-ca"] / g["whole-step"], graphs.get_group((label, prec))
        n, m = len(g), rows.loc[rows["run_id"].isin(g.index.get_level_values("run_id")), "machine_id"].nunique()
        counts = rows[["compiled_graphs", "graph_breaks"]].max()
        where = ("" if counts.isna().any() else
                 f", with {counts['compiled_graphs']:.0f} graphs and {counts['graph_breaks']:.0f} graph breaks")
        out.append(f"{MODEL_NAMES[label]} {prec}: {config_name(mode, 'whole-step-ca')} "
                   f"{g['whole-step-ca'].median():.2f} ms against {g['whole-step'].median():.2f} ms without it: "
                   f"{range_text(ratio.median(), ratio.min(), ratio.max())} as long ({runs_on_starts(n, m)}; "
                   f"{verdict_phrase(verdict_word(verdict(1 / ratio.max(), 1 / ratio.min(), n, m)))}){where}.")
    return out


def ceiling_findings(df: pd.DataFrame, device: str, precision: str = "fp32") -> list[str]:
    """Plain sentences for chapter 3: what each execution mode buys over eager, and the ceiling."""
    tab = placement_table(df)
    tab = tab[(tab["device_slug"] == device) & (tab["precision"] == precision)]
    out = []
    for label in ("gpt2", "fasttransformer"):
        t = tab[tab["label"] == label].set_index("config")["median_ms"]
        eager, graph = t.get(CONFIG_NAMES[("eager", "default")]), t.get(CONFIG_NAMES[("cudagraph", "fused")])
        base = [c for c in t.index if (c in [CONFIG_NAMES[k] for k in BASELINE_CONFIGS])]
        if eager is None or graph is None or not base:
            continue
        best = min(base, key=lambda c: t[c])
        out.append(f"{MODEL_NAMES[label]} ({precision}, {gpu_label(device)}): eager {eager:.2f} ms; one CUDA graph "
                   f"of the whole step {graph:.2f} ms ({eager / graph:.2f}× faster, no compiler); the fastest compiled "
                   f"configuration, {best}, {t[best]:.2f} ms ({graph / t[best]:.2f}× faster again).")
    return out
