"""Chapters 3, 5 and 6 on the baselines suite: its tables with the spread written out and its figures, from
:mod:`ftlib.views.baselines`' per-run computations (chapter 3's closing, in words: :mod:`ftlib.views.ceiling`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ftlib.analysis.claims import POST_GPU, post_step_rows, roofline_projection
from ftlib.model.config import preset
from ftlib.views.baselines import (
    CONFIG_NAMES,
    POST_CONFIG,
    config_name,
    engine_table,
    fmt_range,
    lookup_row,
    model_speedups,
    newest_engine,
    placement_table,
    runs_left_out,
    runs_note,
    runs_on_starts,
    spread,
    strongest,
    todays_engine,
    valid_rows,
)
from ftlib.views.bench import MODEL_NAMES, gpu_label, model_title
from ftlib.views.engine_config import TODAY
from ftlib.views.tables import table_view

# The closing paragraphs' text where no complete run is stored.
NO_RUNS = "No complete run of the baselines suite is stored yet: `bash ci/gpu-run --only baselines` measures it."
# What a model-against-model ratio is taken over: one device, precision and configuration.
MODEL_KEYS = ["device_slug", "precision", "config"]


def model_table(df: pd.DataFrame, faster: str = "fasttransformer", slower: str = "gpt2") -> pd.DataFrame:
    """FastTransformer against GPT-2 in each configuration (same run, mode and precision), over runs."""
    per_run = model_speedups(df, faster, slower)
    if per_run.empty:
        return pd.DataFrame()
    tab = spread(per_run, MODEL_KEYS)
    ms = per_run.groupby(MODEL_KEYS, sort=False).agg(
        slow_ms=("median_ms_slow", "median"), fast_ms=("median_ms_fast", "median")).reset_index()
    tab = ms.merge(tab, on=MODEL_KEYS)
    return pd.DataFrame({
        "device": tab["device_slug"], "precision": tab["precision"], "configuration": tab["config"],
        f"{MODEL_NAMES[slower]} ms": tab["slow_ms"], f"{MODEL_NAMES[faster]} ms": tab["fast_ms"],
        "speed-up (median, min–max)": [fmt_range(m, lo, hi) for m, lo, hi in
                                       zip(tab["median"], tab["min"], tab["max"])],
        "verdict": tab["verdict"], "runs": [runs_note(r, m) for r, m in zip(tab["runs"], tab["machines"])]})


def engine_speedup_table(df: pd.DataFrame) -> pd.DataFrame:
    """The engine against the strongest baseline of the same run, per device, model, precision and engine
    (the current one, or an earlier one measured before some of the current defaults existed)."""
    tab = engine_table(df)
    if tab.empty:
        return pd.DataFrame()
    return pd.DataFrame({
        "device": tab["device_slug"], "model": tab["label"].map(MODEL_NAMES), "precision": tab["precision"],
        "engine": tab["engine_config"], "engine ms": tab["engine_ms"], "strongest baseline": tab["baseline"],
        "baseline ms": tab["baseline_ms"],
        "engine speed-up (median, min–max)": [fmt_range(m, lo, hi) for m, lo, hi in
                                              zip(tab["median"], tab["min"], tab["max"])],
        "verdict": tab["verdict"], "runs": [runs_note(r, m) for r, m in zip(tab["runs"], tab["machines"])]})


def left_out_note(df: pd.DataFrame) -> str:
    """Markdown: the runs left out of every ratio against the strongest baseline because they lack a
    configuration that was the strongest in other runs ('' where none is)."""
    out = runs_left_out(df)
    if out.empty:
        return ""
    lines = [f"- {gpu_label(r['device_slug'])}, {model_title(r['label'])} {r['precision']}: "
             f"{r['runs left out']} run{'s' * (r['runs left out'] != 1)} without *{r['lacking']}*"
             for _, r in out.iterrows()]
    return ("Runs left out of these ratios: each lacks a configuration that was the strongest baseline in "
            "other runs of the same device, model and precision, so its fastest is of a weaker set.\n\n"
            + "\n".join(lines))


PLACEMENT_COLUMNS = ["device", "model", "precision", "engine measured against", "baseline ms",
                     "engine speed-up (median, min–max)", "runs", "verdict"]


def placement_effect(df: pd.DataFrame) -> pd.DataFrame:
    """How the baseline's optimizer placement changes the engine's speed-up, per run then over runs.

    Against the post's compiled configuration (reduce-overhead, AdamW left eager), against
    reduce-overhead with fused AdamW, and against the strongest baseline of the run; over the runs that
    measured the current engine only, so ``baseline ms`` is the median of those runs, with their count.
    """
    v = valid_rows(df)
    eng = todays_engine(df)[["device_slug", "run_id", "machine_id", "label", "precision", "median_ms"]]
    parts = []
    for mode, opt in (POST_CONFIG, ("compile-ro", "fused"), ("compile-ro", "whole-step")):
        b = v[(v["mode"] == mode) & (v["optimizer_kind"] == opt)]
        m = eng.merge(b[["device_slug", "run_id", "label", "precision", "median_ms"]],
                      on=["device_slug", "run_id", "label", "precision"], suffixes=("", "_base"))
        m["against"] = config_name(mode, opt)
        parts.append(m)
    best = strongest(df)
    m = eng.merge(best, on=["device_slug", "run_id", "machine_id", "label", "precision"])
    m = m.rename(columns={"baseline_ms": "median_ms_base"})
    m["against"] = "strongest baseline of the run"
    parts.append(m[["device_slug", "run_id", "machine_id", "label", "precision", "median_ms", "median_ms_base",
                    "against"]])
    per_run = pd.concat(parts, ignore_index=True)
    if per_run.empty:  # no run of the current engine: the table's columns, no rows
        return pd.DataFrame(columns=PLACEMENT_COLUMNS)
    per_run["speedup"] = per_run["median_ms_base"] / per_run["median_ms"]
    tab = spread(per_run, ["device_slug", "label", "precision", "against"])
    ms = per_run.groupby(["device_slug", "label", "precision", "against"], sort=False)["median_ms_base"].median()
    tab = tab.merge(ms.rename("baseline ms").reset_index(), on=["device_slug", "label", "precision", "against"])
    return pd.DataFrame(dict(zip(PLACEMENT_COLUMNS, (
        tab["device_slug"], tab["label"].map(MODEL_NAMES), tab["precision"], tab["against"], tab["baseline ms"],
        [fmt_range(m, lo, hi) for m, lo, hi in zip(tab["median"], tab["min"], tab["max"])],
        [runs_on_starts(int(n), int(m)) for n, m in zip(tab["runs"], tab["machines"])], tab["verdict"]))))


def earlier_engines(df: pd.DataFrame, device: str) -> dict[tuple[str, str], str]:
    """(model, precision) -> the configuration name of its newest earlier engine on ``device``, for each model
    and precision whose newest engine run is not the current engine's: the bar that stands in for it."""
    newest = newest_engine(engine_table(df)) if not df.empty else pd.DataFrame(columns=["device_slug"])
    engine = config_name("engine", "default")
    return {(r.label, r.precision): f"{engine}, {r.engine_config}" for r in newest.itertuples()
            if r.device_slug == device and r.engine_config != TODAY}


def config_figure(df: pd.DataFrame, device: str, precision: str, labels: Sequence[str] | None = None) -> go.Figure:
    """Step time of every configuration, one bar per model: median over runs, min–max as error bars."""
    from ftlib.views.plots import MODEL_COLORS, legend_below, with_subtitle

    tab = placement_table(df)
    tab = tab[(tab["device_slug"] == device) & (tab["precision"] == precision)]
    # A model whose current engine no run here measured shows its newest earlier engine, on a bar of its own.
    earlier_bar = "engine (an earlier one)"
    earlier = {label: config for (label, prec), config in earlier_engines(df, device).items() if prec == precision}
    for label, config in earlier.items():
        tab = pd.concat([tab, tab[(tab["label"] == label) & (tab["config"] == config)].assign(config=earlier_bar)])
    order = [c for c in [CONFIG_NAMES[k] for k in CONFIG_NAMES] + [earlier_bar] if c in set(tab["config"])]
    fig = go.Figure()
    gaps = False  # a configuration some model has no row for: its bar is missing, and the subtitle says why
    for label in labels or [x for x in MODEL_NAMES if x in set(tab["label"])]:
        t = tab[tab["label"] == label].set_index("config").reindex(order)
        gaps = gaps or bool(t["median_ms"].isna().any())
        fig.add_trace(go.Bar(
            name=model_title(label), y=list(t.index), x=t["median_ms"], orientation="h",
            marker_color=MODEL_COLORS.get(label),
            error_x=dict(type="data", symmetric=False, array=t["max_ms"] - t["median_ms"],
                         arrayminus=t["median_ms"] - t["min_ms"])))
    engine = config_name("engine", "default")
    eng = tab[tab["config"] == engine]
    rest = tab[~tab["config"].str.startswith("engine")]  # the compiled and eager bars (not any engine's)
    # Configurations added to the suite later have fewer runs than the first ones: the subtitle gives the range.
    lo, hi = (int(rest["runs"].min()), int(rest["runs"].max())) if not rest.empty else (0, 0)
    runs = f"median of {hi} run{'s' * (hi != 1)}" if lo == hi else f"median over each bar's runs, {lo}–{hi}"
    # Runs that measured an earlier engine count for the compiled bars, not for the current engine: each model's
    # engine bar whose run count differs says its own.
    own = [f"{model_title(label)}'s {int(n)}" for label, n in zip(eng["label"], eng["runs"])
           if not lo == int(n) == hi]
    eng_runs = f" (the engine bars over fewer: {', '.join(own)})" if own else ""
    if earlier:  # chapter 6's engine table names the defaults each earlier engine lacked
        owners = " and ".join(f"{model_title(x)}'s" for x in earlier)
        eng_runs += (f"; {owners} engine bar{'s' * (len(earlier) > 1)}: an earlier engine "
                     "(no run of the current one here)")
    # A bar pair per configuration drawn (those no run measured take no room).
    fig.update_layout(barmode="group", height=120 + 34 * len(order) * max(1, len(fig.data)) // 2,
                      xaxis_title="ms per step (lower is faster)", yaxis=dict(autorange="reversed"),
                      margin=dict(l=330))
    with_subtitle(fig, f"Training step time per configuration, {gpu_label(device)}, {precision}",
                  f"{runs}{eng_runs}; bars span min–max"
                  + ("; a missing bar: no run here measured that model in that configuration" if gaps else ""))
    return legend_below(fig)


# Configurations chapter 5 compares the two models in: the post's, the best placements, the manual CUDA graphs
# (of the eager kernels, and of the compiled step: the strongest baseline in most runs that measured it), the
# engine, and each model at its own fastest compiled configuration.
KEY_CONFIGS = (config_name(*POST_CONFIG), config_name("compile-ro", "fused"), config_name("compile-ro", "whole-step"),
               config_name("cudagraph", "fused"), config_name("compile", "graphed"), "strongest baseline of each",
               config_name("engine", "default"))


def precision_table(df: pd.DataFrame) -> pd.DataFrame:
    """FastTransformer's speed-up over GPT-2 per precision in the key configurations, over runs."""
    tab = model_table(df)
    if tab.empty:
        return tab
    tab = tab[tab["configuration"].isin(KEY_CONFIGS)].copy()
    tab["order"] = tab["configuration"].map({c: i for i, c in enumerate(KEY_CONFIGS)})
    return tab.sort_values(["device", "precision", "order"], kind="stable").drop(columns="order")


def eager_inversion(df: pd.DataFrame) -> pd.DataFrame:
    """The post's "eager inversion": FastTransformer run eagerly against GPT-2 compiled, per run.

    A ratio above 1 (GPT-2's compiled step over FastTransformer's eager step) means the eager
    FastTransformer is the faster one, as the post claims.
    """
    v = valid_rows(df)
    keys = ["device_slug", "run_id", "machine_id", "precision"]
    fe = v[(v["label"] == "fasttransformer") & (v["mode"] == "eager") & (v["optimizer_kind"] == "default")]
    fe = fe[[*keys, "median_ms"]]
    parts = []
    gp = v[(v["label"] == "gpt2") & (v["mode"] == POST_CONFIG[0]) & (v["optimizer_kind"] == POST_CONFIG[1])]
    m = fe.merge(gp[[*keys, "median_ms"]], on=keys, suffixes=("_ft", "_gpt2"))
    m["GPT-2 compiled as"] = config_name(*POST_CONFIG)
    parts.append(m)
    best = strongest(df)
    b = best[best["label"] == "gpt2"].rename(columns={"baseline_ms": "median_ms_gpt2"})
    m = fe.rename(columns={"median_ms": "median_ms_ft"}).merge(b[[*keys, "median_ms_gpt2"]], on=keys)
    m["GPT-2 compiled as"] = "its fastest compiled configuration"
    parts.append(m)
    per_run = pd.concat(parts, ignore_index=True)
    if per_run.empty:
        return pd.DataFrame()
    per_run["speedup"] = per_run["median_ms_gpt2"] / per_run["median_ms_ft"]
    tab = spread(per_run, ["device_slug", "precision", "GPT-2 compiled as"])
    ms = per_run.groupby(["device_slug", "precision", "GPT-2 compiled as"], sort=False).agg(
        ft=("median_ms_ft", "median"), gpt2=("median_ms_gpt2", "median")).reset_index()
    tab = tab.merge(ms, on=["device_slug", "precision", "GPT-2 compiled as"])
    return pd.DataFrame({
        "device": tab["device_slug"], "precision": tab["precision"], "GPT-2 compiled as": tab["GPT-2 compiled as"],
        "FastTransformer eager ms": tab["ft"], "GPT-2 compiled ms": tab["gpt2"],
        "GPT-2 compiled / FastTransformer eager (median, min–max)": [fmt_range(m, lo, hi) for m, lo, hi in
                                                        zip(tab["median"], tab["min"], tab["max"])],
        "inversion": ["holds" if v == "faster" else "does not hold" if v in ("slower", "ties") else v
                      for v in tab["verdict"]]})


def throughput_figure(df: pd.DataFrame, device: str) -> go.Figure:
    """Tokens per second per precision (the post's Figure 3): the post's configuration, each model's
    fastest compiled configuration, and the engine; medians over runs, min–max whiskers."""
    from ftlib.views.plots import MODEL_COLORS, legend_below, with_subtitle

    tab = placement_table(df)
    tab = tab[tab["device_slug"] == device]
    shape = df[df["device_slug"] == device][["B", "T"]].iloc[0] if not tab.empty else None
    tokens = int(shape["B"] * shape["T"]) if shape is not None else 0
    best = strongest(df)
    best = best[best["device_slug"] == device].groupby(["label", "precision"])["baseline_ms"].agg(
        ["median", "min", "max"])
    # Where no run here measured the current engine of a model and precision, its newest earlier engine stands
    # in, on a bar named so (as in the step-time figure).
    engine = config_name("engine", "default")
    earlier = earlier_engines(df, device)
    fig = go.Figure()
    groups = (config_name(*POST_CONFIG), "fastest compiled", engine)
    for label in ("gpt2", "fasttransformer"):
        xs, ys, up, down = [[], []], [], [], []
        for prec in HEADLINE_ORDER:
            for g in groups:
                name = SHORT_GROUPS[g]
                if g == "fastest compiled":
                    if (label, prec) not in best.index:
                        continue
                    med, lo, hi = best.loc[(label, prec)]
                else:
                    t = lookup_row(tab, label=label, precision=prec, config=g)
                    if t is None and g == engine and (label, prec) in earlier:
                        t, name = lookup_row(tab, label=label, precision=prec, config=earlier[label, prec]), EARLIER
                    if t is None:
                        continue
                    med, lo, hi = t["median_ms"], t["min_ms"], t["max_ms"]
                xs[0].append(prec)
                xs[1].append(name)
                ys.append(tokens / med * 1e3)
                up.append(tokens / lo * 1e3 - tokens / med * 1e3)
                down.append(tokens / med * 1e3 - tokens / hi * 1e3)
        fig.add_trace(go.Bar(name=MODEL_NAMES[label], x=xs, y=ys, marker_color=MODEL_COLORS.get(label),
                             error_y=dict(type="data", symmetric=False, array=up, arrayminus=down)))
    fig.update_layout(barmode="group", height=480, yaxis_title="tokens / s (higher is faster)")
    with_subtitle(fig, f"Training throughput, {gpu_label(device)}, {tokens:,} tokens per step",
                  f"post's setup: {config_name(*POST_CONFIG)}; medians over runs, whiskers min–max"
                  + ("; earlier engine: no run of the current one here (chapter 6 names what it lacked)"
                     if any(EARLIER in tr.x[1] for tr in fig.data) else ""))
    fig.update_xaxes(tickangle=0)
    return legend_below(fig)


SHORT_GROUPS = {config_name(*POST_CONFIG): "post's setup", "fastest compiled": "fastest<br>compiled",
                config_name("engine", "default"): "engine"}
EARLIER = "earlier<br>engine"  # the throughput figure's bar for an earlier engine, where no current one ran


HEADLINE_ORDER = ("fp32", "tf32", "bf16", "fp16")


@table_view
def post_step_table() -> list[dict[str, Any]]:
    """The post's step times (Figure 1, a T4), labelled as claims."""
    return [{"source": r["source"], "device": r["device"], "model": r["label"], "mode": r["mode"],
             "ms per step": r["median_ms"], "tokens/s": r["tokens_per_s"]} for r in post_step_rows()]


@table_view
def t4_floor_table(B: int = 32, T: int = 256) -> list[dict[str, Any]]:
    """A projection, not a measurement: each model's roofline floor on the post's T4."""
    out = []
    for name in ("gpt2", "fasttransformer"):
        p = roofline_projection(preset(name), B, T, POST_GPU)
        out.append({"device": POST_GPU, "model": name, "projection: floor ms": p["floor_ms"],
                    "compute-bound ms": p["compute_ms"], "memory-bound ms (eager bytes)": p["memory_ms"]})
    return out


@table_view
def post_throughput_table() -> list[dict[str, Any]]:
    """The post's compiled throughput per model (Figure 3, a T4), labelled as claims."""
    post = {(r["label"], r["mode"]): r for r in post_step_rows()}
    return [{"source": f"post (claim), {POST_GPU}", "model": m, "mode": "compile-ro",
             "tokens/s": post[(m, "compile-ro")]["tokens_per_s"]} for m in ("gpt2", "fasttransformer")]
