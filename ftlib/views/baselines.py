"""The baselines suite read back: the strongest compiled step, speed-ups against it, and their spread.

Rules every function here keeps (the book's measuring rules):

* **One run per ratio.** A ratio divides two rows of the same run (one process on one machine,
  ``run_id``), never rows of different runs; a run counts only when it is complete (every case
  of the suite stored, from a clean commit).
* **Strongest baseline.** A speed-up over PyTorch is measured against the fastest correct
  configuration of the same model, precision and shape in that run: ``torch.compile`` in each
  mode with the optimizer in each place (:data:`BASELINE_CONFIGS`), or the manual whole-step
  CUDA graph; the table names which one it was.
* **Spread.** Over runs, a ratio is shown as its median with min and max; a verdict is given
  only when the whole range is on one side (:func:`verdict`) and the runs come from at least
  two machine starts.
* **Never pooled.** Everything is grouped by device (``device_slug``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from ftlib.analysis.claims import POST_CLAIMED
from ftlib.harness.bench.cases import Case
from ftlib.harness.bench.step import case_ident
from ftlib.harness.provenance import is_clean_commit
from ftlib.harness.results import load_rows

SUITE = "baselines"
# (mode, optimizer) -> how the book names the configuration.
CONFIG_NAMES: dict[tuple[str, str], str] = {
    ("eager", "default"): "eager, foreach AdamW",
    ("eager", "fused"): "eager, fused AdamW",
    ("cudagraph", "fused"): "manual CUDA graph of the whole step",
    ("compile", "default"): "compile, foreach AdamW outside",
    ("compile", "fused"): "compile, fused AdamW outside",
    ("compile", "whole-step"): "compile, whole step compiled",
    ("compile-ro", "default"): "compile reduce-overhead, foreach AdamW outside",
    ("compile-ro", "fused"): "compile reduce-overhead, fused AdamW outside",
    ("compile-ro", "whole-step"): "compile reduce-overhead, whole step compiled",
    ("engine", "default"): "engine",
}
# What a speed-up over PyTorch is measured against: every compiled configuration, and the manual
# CUDA graph of the whole step (eager kernels, one launch).
BASELINE_CONFIGS = tuple(k for k in CONFIG_NAMES if k[0] in ("cudagraph", "compile", "compile-ro"))
# The post's own compiled configuration: reduce-overhead with AdamW left eager (PyTorch's default).
POST_CONFIG = ("compile-ro", "default")
TIE_BAND = 0.02  # a range inside 1 +- 2% is a tie
MIN_RUNS, MIN_MACHINES = 3, 2
MODEL_NAMES = {"gpt2": "GPT-2", "fasttransformer": "FastTransformer",
               "fasttransformer-broadcast": "FastTransformer, K/V as (B, 1, T, d)"}

_COLUMNS = ["device_slug", "device", "run_id", "machine_id", "commit", "date", "label", "precision", "mode",
            "optimizer_kind", "config", "B", "T", "median_ms", "p20_ms", "p80_ms", "status", "check_ok",
            "first_step_s", "compiled_graphs", "graph_breaks", "cudagraph_skips", "ident"]


def config_name(mode: str, optimizer: str | None) -> str:
    return CONFIG_NAMES.get((mode, optimizer or "default"), f"{mode}, {optimizer}")


def frame(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Rows of the suite as a tidy table, one row per measurement (``ident``: what, whichever run)."""
    recs = []
    for r in rows:
        if "run_id" not in r:
            continue  # rows from before runs were recorded cannot be paired
        recs.append({**{c: r.get(c) for c in _COLUMNS}, "ident": case_ident(r),
                     "config": config_name(r["mode"], r.get("optimizer_kind"))})
    return pd.DataFrame.from_records(recs, columns=_COLUMNS)


def complete_runs(df: pd.DataFrame, cases: Sequence[Case], bench: str = SUITE,
                  require_clean: bool = True) -> pd.DataFrame:
    """Only the rows of runs that hold every case of ``cases`` and come from one clean commit.

    Completeness is judged per precision: a run that measured every case of bf16, tf32 and
    fp32 but was cut short in fp16 keeps its first three precisions.
    """
    if df.empty:
        return df
    want: dict[str, set[str]] = {}
    for c in cases:
        want.setdefault(c.precision, set()).add(c.ident(bench))
    keep = []
    for (_, _, prec), g in df.groupby(["device_slug", "run_id", "precision"], sort=False):
        commits = set(g["commit"])
        clean = len(commits) == 1 and is_clean_commit(next(iter(commits)))
        if prec in want and want[prec] <= set(g["ident"]) and (clean or not require_clean):
            keep.append(g[g["ident"].isin(want[prec])])
    return pd.concat(keep, ignore_index=True) if keep else df.iloc[0:0]


def load(cases: Sequence[Case], bench: str = SUITE, rows: Iterable[dict[str, Any]] | None = None,
         tag: str | None = None) -> pd.DataFrame:
    """The complete runs of ``bench``: the stored rows of every GPU folder, or ``rows``.

    ``tag`` marks rows just measured here (a reader's own run): they are kept even from an
    uncommitted checkout, and their device is shown as ``<device> (<tag>)`` so that they are
    never grouped with the stored runs of the same GPU.
    """
    rows = load_rows(bench) if rows is None else rows
    df = complete_runs(frame(rows), cases, bench, require_clean=tag is None)
    if tag and not df.empty:
        df = df.assign(device_slug=df["device_slug"] + f" ({tag})")
    return df


def combine(*frames: pd.DataFrame) -> pd.DataFrame:
    """Several loaded frames as one (empty ones dropped)."""
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else frame([])


def _valid(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that measured a step that computes what eager computes (status ok, loss check passed)."""
    return df[(df["status"] == "ok") & (df["check_ok"] == True)]  # noqa: E712 - None is not True


def strongest(df: pd.DataFrame) -> pd.DataFrame:
    """Per (device, run, model, precision): the fastest baseline configuration and its time."""
    base = _valid(df)
    base = base[[(m, o) in BASELINE_CONFIGS for m, o in zip(base["mode"], base["optimizer_kind"])]]
    if base.empty:
        return pd.DataFrame(columns=["device_slug", "run_id", "machine_id", "label", "precision",
                                     "baseline", "baseline_ms"])
    idx = base.groupby(["device_slug", "run_id", "label", "precision"])["median_ms"].idxmin()
    best = base.loc[idx, ["device_slug", "run_id", "machine_id", "label", "precision", "config", "median_ms"]]
    return best.rename(columns={"config": "baseline", "median_ms": "baseline_ms"}).reset_index(drop=True)


def speedups(df: pd.DataFrame, mode: str = "engine", optimizer: str = "default") -> pd.DataFrame:
    """Per run: the (mode, optimizer) configuration against the strongest baseline of the same run."""
    best = strongest(df)
    mine = _valid(df)
    mine = mine[(mine["mode"] == mode) & (mine["optimizer_kind"] == optimizer)]
    mine = mine[["device_slug", "run_id", "label", "precision", "median_ms"]]
    out = mine.merge(best, on=["device_slug", "run_id", "label", "precision"], how="inner")
    out["speedup"] = out["baseline_ms"] / out["median_ms"]
    return out


def verdict(lo: float, hi: float, n_runs: int, n_machines: int) -> str:
    """'faster', 'slower' or 'ties' when every run agrees (and there are enough of them)."""
    if n_runs < MIN_RUNS or n_machines < MIN_MACHINES:
        return f"too few runs ({n_runs} runs, {n_machines} machine starts)"
    if 1 - TIE_BAND <= lo and hi <= 1 + TIE_BAND:
        return "ties"
    if lo > 1:
        return "faster"
    if hi < 1:
        return "slower"
    return "no verdict: the runs disagree"


def spread(per_run: pd.DataFrame, by: Sequence[str], value: str = "speedup") -> pd.DataFrame:
    """Median, min and max of ``value`` over runs per group, with counts and the verdict."""
    if per_run.empty:
        return pd.DataFrame(columns=[*by, "median", "min", "max", "runs", "machines", "verdict"])
    g = per_run.groupby(list(by), sort=False)
    out = g[value].agg(median="median", min="min", max="max").reset_index()
    counts = g.agg(runs=("run_id", "nunique"), machines=("machine_id", "nunique")).reset_index()
    out = out.merge(counts, on=list(by))
    out["verdict"] = [verdict(lo, hi, n, m) for lo, hi, n, m in
                      zip(out["min"], out["max"], out["runs"], out["machines"])]
    return out


def engine_table(df: pd.DataFrame) -> pd.DataFrame:
    """The engine against the strongest baseline, per device, model and precision, over runs."""
    per_run = speedups(df)
    if per_run.empty:
        return spread(per_run, ["device_slug", "label", "precision"])
    tab = spread(per_run, ["device_slug", "label", "precision"])
    ms = per_run.groupby(["device_slug", "label", "precision"]).agg(
        engine_ms=("median_ms", "median"), baseline_ms=("baseline_ms", "median"),
        baseline=("baseline", lambda s: ", ".join(sorted(set(s))))).reset_index()
    return ms.merge(tab, on=["device_slug", "label", "precision"])


def model_speedups(df: pd.DataFrame, faster: str = "fasttransformer", slower: str = "gpt2") -> pd.DataFrame:
    """Per run and configuration: how much faster ``faster`` steps than ``slower`` (same run, mode, precision).

    Also the two models each at its own strongest baseline (config ``'strongest baseline'``).
    """
    v = _valid(df)
    keys = ["device_slug", "run_id", "machine_id", "precision", "config"]
    a = v[v["label"] == faster][[*keys, "median_ms"]]
    b = v[v["label"] == slower][[*keys, "median_ms"]]
    out = a.merge(b, on=keys, suffixes=("_fast", "_slow"))
    best = strongest(df)
    ba, bb = best[best["label"] == faster], best[best["label"] == slower]
    both = ba.merge(bb, on=["device_slug", "run_id", "machine_id", "precision"], suffixes=("_fast", "_slow"))
    both = both.rename(columns={"baseline_ms_fast": "median_ms_fast", "baseline_ms_slow": "median_ms_slow"})
    both["config"] = "strongest baseline of each"
    out = pd.concat([out, both[[*keys, "median_ms_fast", "median_ms_slow"]]], ignore_index=True)
    out["speedup"] = out["median_ms_slow"] / out["median_ms_fast"]
    return out


def placement_table(df: pd.DataFrame) -> pd.DataFrame:
    """Step time of every configuration over runs (median, min, max), per device, model, precision."""
    v = _valid(df)
    if v.empty:
        return pd.DataFrame(columns=["device_slug", "label", "precision", "config", "median_ms", "min_ms",
                                     "max_ms", "runs"])
    g = v.groupby(["device_slug", "label", "precision", "config"], sort=False)
    return g.agg(median_ms=("median_ms", "median"), min_ms=("median_ms", "min"), max_ms=("median_ms", "max"),
                 runs=("run_id", "nunique")).reset_index()


def runs_summary(df: pd.DataFrame) -> pd.DataFrame:
    """The runs behind a table: device, machine start, commit, date and rows, one line per run."""
    if df.empty:
        return pd.DataFrame(columns=["device", "run_id", "machine_id", "commit", "date", "rows"])
    g = df.groupby(["device", "run_id"], sort=False)
    out = g.agg(machine_id=("machine_id", "first"), commit=("commit", "first"), date=("date", "min"),
                rows=("ident", "size")).reset_index()
    out["date"] = out["date"].str[:10]
    return out


# ---------------------------------------------------------------------------------------
# What the chapters show: tables with the spread written out, and the per-configuration figure.


def fmt_range(median: float, lo: float, hi: float, unit: str = "×") -> str:
    """'1.29× (1.12–1.32×)': a median over runs with its min and max."""
    return f"{median:.2f}{unit} ({lo:.2f}–{hi:.2f}{unit})"


def _runs_note(runs: int, machines: int) -> str:
    return f"{runs} runs, {machines} machine starts"


def model_table(df: pd.DataFrame, faster: str = "fasttransformer", slower: str = "gpt2") -> pd.DataFrame:
    """FastTransformer against GPT-2 in each configuration (same run, mode and precision), over runs."""
    per_run = model_speedups(df, faster, slower)
    if per_run.empty:
        return pd.DataFrame()
    tab = spread(per_run, ["device_slug", "precision", "config"])
    ms = per_run.groupby(["device_slug", "precision", "config"], sort=False).agg(
        slow_ms=("median_ms_slow", "median"), fast_ms=("median_ms_fast", "median")).reset_index()
    tab = ms.merge(tab, on=["device_slug", "precision", "config"])
    return pd.DataFrame({
        "device": tab["device_slug"], "precision": tab["precision"], "configuration": tab["config"],
        f"{MODEL_NAMES[slower]} ms": tab["slow_ms"], f"{MODEL_NAMES[faster]} ms": tab["fast_ms"],
        "speed-up (median, min–max)": [fmt_range(m, lo, hi) for m, lo, hi in
                                       zip(tab["median"], tab["min"], tab["max"])],
        "verdict": tab["verdict"], "runs": [_runs_note(r, m) for r, m in zip(tab["runs"], tab["machines"])]})


def engine_summary(df: pd.DataFrame) -> pd.DataFrame:
    """The engine against the strongest baseline of the same run, per device, model and precision."""
    tab = engine_table(df)
    if tab.empty:
        return pd.DataFrame()
    return pd.DataFrame({
        "device": tab["device_slug"], "model": tab["label"].map(MODEL_NAMES), "precision": tab["precision"],
        "engine ms": tab["engine_ms"], "strongest baseline": tab["baseline"], "baseline ms": tab["baseline_ms"],
        "engine speed-up (median, min–max)": [fmt_range(m, lo, hi) for m, lo, hi in
                                              zip(tab["median"], tab["min"], tab["max"])],
        "verdict": tab["verdict"], "runs": [_runs_note(r, m) for r, m in zip(tab["runs"], tab["machines"])]})


def placement_effect(df: pd.DataFrame) -> pd.DataFrame:
    """How the baseline's optimizer placement changes the engine's speed-up, per run then over runs.

    Against the post's compiled configuration (reduce-overhead, AdamW left eager), against
    reduce-overhead with fused AdamW, and against the strongest baseline of the run.
    """
    v = _valid(df)
    eng = v[v["mode"] == "engine"][["device_slug", "run_id", "machine_id", "label", "precision", "median_ms"]]
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
    if per_run.empty:
        return pd.DataFrame()
    per_run["speedup"] = per_run["median_ms_base"] / per_run["median_ms"]
    tab = spread(per_run, ["device_slug", "label", "precision", "against"])
    ms = per_run.groupby(["device_slug", "label", "precision", "against"], sort=False)["median_ms_base"].median()
    tab = tab.merge(ms.rename("baseline ms").reset_index(), on=["device_slug", "label", "precision", "against"])
    return pd.DataFrame({
        "device": tab["device_slug"], "model": tab["label"].map(MODEL_NAMES), "precision": tab["precision"],
        "engine measured against": tab["against"], "baseline ms": tab["baseline ms"],
        "engine speed-up (median, min–max)": [fmt_range(m, lo, hi) for m, lo, hi in
                                              zip(tab["median"], tab["min"], tab["max"])],
        "verdict": tab["verdict"]})


def config_figure(df: pd.DataFrame, device: str, precision: str, labels: Sequence[str] | None = None):
    """Step time of every configuration, one bar per model: median over runs, min–max as error bars."""
    import plotly.graph_objects as go

    from ftlib.views.plots import MODEL_COLORS, legend_below

    tab = placement_table(df)
    tab = tab[(tab["device_slug"] == device) & (tab["precision"] == precision)]
    order = [CONFIG_NAMES[k] for k in CONFIG_NAMES]
    fig = go.Figure()
    for label in labels or [x for x in MODEL_NAMES if x in set(tab["label"])]:
        t = tab[tab["label"] == label].set_index("config").reindex([c for c in order if c in set(tab["config"])])
        fig.add_trace(go.Bar(
            name=MODEL_NAMES.get(label, label), y=list(t.index), x=t["median_ms"], orientation="h",
            marker_color=MODEL_COLORS.get(label),
            error_x=dict(type="data", symmetric=False, array=t["max_ms"] - t["median_ms"],
                         arrayminus=t["median_ms"] - t["min_ms"])))
    runs = int(tab["runs"].max()) if not tab.empty else 0
    fig.update_layout(barmode="group", height=120 + 34 * len(order) * max(1, len(fig.data)) // 2,
                      title=f"Training step time per configuration, {device}, {precision} "
                            f"(median of {runs} runs, bars span min–max)",
                      xaxis_title="ms per step (lower is faster)", yaxis=dict(autorange="reversed"),
                      margin=dict(l=330))
    return legend_below(fig)


def range_text(median: float, lo: float, hi: float) -> str:
    """'1.29× (1.12–1.32× over runs)', or just '1.50×' when every run gave the same to 2 decimals."""
    if f"{lo:.2f}" == f"{hi:.2f}":
        return f"{median:.2f}×"
    return f"{median:.2f}× ({lo:.2f}–{hi:.2f}× over runs)"


def _lookup(tab: pd.DataFrame, **match: Any) -> pd.Series | None:
    sel = tab
    for k, v in match.items():
        sel = sel[sel[k] == v]
    return None if sel.empty else sel.iloc[0]


def chapter3_findings(df: pd.DataFrame, precision: str = "fp32") -> str:
    """Chapter 3's closing paragraph, per device, from the runs in ``df``."""
    if df.empty:
        return "No complete run of the baselines suite is stored yet: `bash ci/gpu-run --only baselines` measures it."
    per_run = model_speedups(df)
    tab = spread(per_run, ["device_slug", "precision", "config"])
    eng = engine_table(df)
    parts = []
    for dev in sorted(set(df["device_slug"])):
        post = _lookup(tab, device_slug=dev, precision=precision, config=config_name(*POST_CONFIG))
        best = _lookup(tab, device_slug=dev, precision=precision, config="strongest baseline of each")
        runs = df[df["device_slug"] == dev]
        lines = [f"**{dev}** ({runs['run_id'].nunique()} runs on {runs['machine_id'].nunique()} machine starts, "
                 f"{precision}):"]
        if post is not None:
            lines.append(f"- Under the post's configuration ({config_name(*POST_CONFIG)}), FastTransformer steps "
                         f"{range_text(post['median'], post['min'], post['max'])} faster than GPT-2 "
                         f"(verdict: {post['verdict']}); the post claims "
                         f"{POST_CLAIMED['speedup_compiled']:.4g}× on a T4.")
        if best is not None:
            lines.append(f"- With each model at its fastest compiled configuration the ratio is "
                         f"{range_text(best['median'], best['min'], best['max'])} ({best['verdict']}).")
        lines += [f"- {s}" for s in ceiling_findings(df, dev, precision)]
        for label in ("gpt2", "fasttransformer"):
            e = _lookup(eng, device_slug=dev, label=label, precision=precision)
            if e is not None:
                lines.append(f"- The book's engine for {MODEL_NAMES[label]} against that fastest compiled step: "
                             f"{range_text(e['median'], e['min'], e['max'])} ({e['verdict']}).")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


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
        out.append(f"{MODEL_NAMES[label]} ({precision}, {device}): eager {eager:.2f} ms; one CUDA graph of the "
                   f"whole step {graph:.2f} ms ({eager / graph:.2f}× faster, no compiler); the fastest compiled "
                   f"configuration, {best}, {t[best]:.2f} ms ({graph / t[best]:.2f}× faster again).")
    return out


# Configurations chapter 5 compares the two models in: the post's, the best placements, the
# manual CUDA graph and the engine, and each model at its own fastest compiled configuration.
KEY_CONFIGS = (config_name(*POST_CONFIG), config_name("compile-ro", "fused"), config_name("compile-ro", "whole-step"),
               config_name("cudagraph", "fused"), "strongest baseline of each", config_name("engine", "default"))


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
    v = _valid(df)
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
        "GPT-2 compiled / FT eager (median, min–max)": [fmt_range(m, lo, hi) for m, lo, hi in
                                                        zip(tab["median"], tab["min"], tab["max"])],
        "inversion": ["holds" if v == "faster" else "does not hold" if v in ("slower", "ties") else v
                      for v in tab["verdict"]]})


def throughput_figure(df: pd.DataFrame, device: str):
    """Tokens per second per precision (the post's Figure 3): the post's configuration, each model's
    fastest compiled configuration, and the engine; medians over runs, min–max whiskers."""
    import plotly.graph_objects as go

    from ftlib.views.plots import MODEL_COLORS, legend_below

    tab = placement_table(df)
    tab = tab[tab["device_slug"] == device]
    shape = df[df["device_slug"] == device][["B", "T"]].iloc[0] if not tab.empty else None
    tokens = int(shape["B"] * shape["T"]) if shape is not None else 0
    best = strongest(df)
    best = best[best["device_slug"] == device].groupby(["label", "precision"])["baseline_ms"].agg(
        ["median", "min", "max"])
    fig = go.Figure()
    groups = (config_name(*POST_CONFIG), "fastest compiled", config_name("engine", "default"))
    for label in ("gpt2", "fasttransformer"):
        xs, ys, up, down = [[], []], [], [], []
        for prec in HEADLINE_ORDER:
            for g in groups:
                if g == "fastest compiled":
                    if (label, prec) not in best.index:
                        continue
                    med, lo, hi = best.loc[(label, prec)]
                else:
                    t = _lookup(tab, label=label, precision=prec, config=g)
                    if t is None:
                        continue
                    med, lo, hi = t["median_ms"], t["min_ms"], t["max_ms"]
                xs[0].append(prec)
                xs[1].append(SHORT_GROUPS[g])
                ys.append(tokens / med * 1e3)
                up.append(tokens / lo * 1e3 - tokens / med * 1e3)
                down.append(tokens / med * 1e3 - tokens / hi * 1e3)
        fig.add_trace(go.Bar(name=MODEL_NAMES[label], x=xs, y=ys, marker_color=MODEL_COLORS.get(label),
                             error_y=dict(type="data", symmetric=False, array=up, arrayminus=down)))
    fig.update_layout(barmode="group", height=480, yaxis_title="tokens / s (higher is faster)",
                      title=f"Training throughput, {device}, {tokens:,} tokens per step<br><sup>post's setup: "
                            f"{config_name(*POST_CONFIG)}; medians over runs, whiskers min–max</sup>")
    fig.update_xaxes(tickangle=0)
    return legend_below(fig)


SHORT_GROUPS = {config_name(*POST_CONFIG): "post's setup", "fastest compiled": "fastest<br>compiled",
                config_name("engine", "default"): "engine"}


HEADLINE_ORDER = ("fp32", "tf32", "bf16", "fp16")


def chapter5_findings(df: pd.DataFrame) -> str:
    """Chapter 5's closing paragraph, per device: the gain per precision, the setup's effect, the inversion."""
    if df.empty:
        return "No complete run of the baselines suite is stored yet: `bash ci/gpu-run --only baselines` measures it."
    per_run = model_speedups(df)
    tab = spread(per_run, ["device_slug", "precision", "config"])
    inv = eager_inversion(df)
    parts = []
    for dev in sorted(set(df["device_slug"])):
        lines = [f"**{dev}**:"]
        for prec in HEADLINE_ORDER:
            post = _lookup(tab, device_slug=dev, precision=prec, config=config_name(*POST_CONFIG))
            best = _lookup(tab, device_slug=dev, precision=prec, config="strongest baseline of each")
            if post is None or best is None:
                continue
            lines.append(f"- {prec}: FastTransformer over GPT-2 is "
                         f"{range_text(post['median'], post['min'], post['max'])} under the post's setup "
                         f"({post['verdict']}) and "
                         f"{range_text(best['median'], best['min'], best['max'])} with each model at its fastest "
                         f"compiled configuration ({best['verdict']}).")
        row = _lookup(inv, device=dev, precision="fp32", **{"GPT-2 compiled as": config_name(*POST_CONFIG)})
        if row is not None:
            lines.append(f"- The eager inversion {row['inversion']} here: FastTransformer run eagerly takes "
                         f"{row['FastTransformer eager ms']:.2f} ms per step in fp32, GPT-2 compiled as the post "
                         f"compiled it {row['GPT-2 compiled ms']:.2f} ms. Eager steps launch every kernel from "
                         "Python, and on a GPU as fast as this one the host, not the GPU, sets their pace.")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def headroom(df: pd.DataFrame) -> pd.DataFrame:
    """Per device, model and precision: eager, the manual CUDA graph, the fastest compiled step and the
    engine, against the floors of the step (chapter 2's accounting at the device's datasheet peaks).

    ``compiled / floor`` is how far the fastest compiled step stays above the roofline floor: the
    room left for kernels.
    """
    from ftlib.analysis.formulas import palm_flops
    from ftlib.analysis.peaks import flops_floor, lookup, step_floor
    from ftlib.harness.suites import headline_models

    models = headline_models()

    tab = placement_table(df)
    best = strongest(df).groupby(["device_slug", "label", "precision"]).agg(
        compiled=("baseline_ms", "median")).reset_index()
    out = []
    for (dev, label, prec), g in tab.groupby(["device_slug", "label", "precision"], sort=False):
        if label not in ("gpt2", "fasttransformer"):
            continue
        t = g.set_index("config")["median_ms"]
        sample = df[(df["device_slug"] == dev) & (df["label"] == label)].iloc[0]
        b = _lookup(best, device_slug=dev, label=label, precision=prec)
        try:
            peaks = lookup(sample["device"])
        except KeyError:
            continue
        cfg = models[label]
        B, T = int(sample["B"]), int(sample["T"])
        roof = step_floor(cfg, B, T, peaks, prec)["floor_s"] * 1e3
        compiled = None if b is None else b["compiled"]
        out.append({"device": dev, "model": MODEL_NAMES[label], "precision": prec,
                    "eager ms": t.get(config_name("eager", "default")),
                    "CUDA graph ms": t.get(config_name("cudagraph", "fused")),
                    "fastest compiled ms": compiled, "engine ms": t.get(config_name("engine", "default")),
                    "FLOP floor ms": flops_floor(palm_flops(cfg, B, T), peaks, prec) * 1e3,
                    "roofline floor ms": roof, "compiled / floor": None if compiled is None else compiled / roof})
    return pd.DataFrame(out)


def chapter6_findings(df: pd.DataFrame) -> str:
    """Chapter 6's closing paragraph, per device: the engine against the strongest and the post's baseline."""
    if df.empty:
        return "No complete run of the baselines suite is stored yet: `bash ci/gpu-run --only baselines` measures it."
    eng, eff, room = engine_table(df), placement_effect(df), headroom(df)
    parts = []
    for dev in sorted(set(df["device_slug"])):
        lines = [f"**{dev}**:"]
        for label in ("fasttransformer", "gpt2"):
            for prec in ("bf16", "tf32", "fp32"):
                e = _lookup(eng, device_slug=dev, label=label, precision=prec)
                if e is None:
                    continue
                post = _lookup(eff, device=dev, model=MODEL_NAMES[label], precision=prec,
                               **{"engine measured against": config_name(*POST_CONFIG)})
                r = _lookup(room, device=dev, model=MODEL_NAMES[label], precision=prec)
                text = (f"- {MODEL_NAMES[label]}, {prec}: the engine steps in {e['engine_ms']:.2f} ms, "
                        f"{range_text(e['median'], e['min'], e['max'])} against the strongest compiled step "
                        f"({e['verdict']})")
                if post is not None:
                    text += f"; against the post's setup it would read {post['engine speed-up (median, min–max)']}"
                if r is not None and r["roofline floor ms"]:
                    text += f"; the roofline floor is {r['roofline floor ms']:.2f} ms"
                lines.append(text + ".")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)
