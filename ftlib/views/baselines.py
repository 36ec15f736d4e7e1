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
* **Never pooled.** Everything is grouped by device (``device_slug``), and the engine's rows by the
  engine they ran (:func:`ftlib.views.engine_config.engine_config`): a run measured before an option became
  a default ran another engine, whose ratios stand apart from the current engine's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from ftlib.harness.bench.cases import Case
from ftlib.harness.bench.step import case_ident
from ftlib.harness.provenance import is_clean_commit
from ftlib.harness.results import load_rows
from ftlib.harness.suites import LATER_STEP_CONFIGS
from ftlib.views.bench import MODEL_NAMES
from ftlib.views.engine_config import TODAY, engine_config, engine_words

SUITE = "baselines"
# (mode, optimizer) -> how the book names the configuration.
CONFIG_NAMES: dict[tuple[str, str], str] = {
    ("eager", "default"): "eager, foreach AdamW",
    ("eager", "fused"): "eager, fused AdamW",
    ("cudagraph", "fused"): "manual CUDA graph of the eager step",
    ("compile", "default"): "compile, foreach AdamW outside",
    ("compile", "fused"): "compile, fused AdamW outside",
    ("compile", "whole-step"): "compile, whole step compiled",
    ("compile-ro", "default"): "compile reduce-overhead, foreach AdamW outside",
    ("compile-ro", "fused"): "compile reduce-overhead, fused AdamW outside",
    ("compile-ro", "whole-step"): "compile reduce-overhead, whole step compiled",
    ("compile", "whole-step-ca"): "compile, whole step and compiled autograd",
    ("compile-ro", "whole-step-ca"): "compile reduce-overhead, whole step and compiled autograd",
    ("compile", "graphed"): "manual CUDA graph of the compiled step",
    ("engine", "default"): "engine",
}
# What a speed-up over PyTorch is measured against: every compiled configuration, and the manual
# CUDA graph of the eager step (the whole step's eager kernels, one launch).
BASELINE_CONFIGS = tuple(k for k in CONFIG_NAMES if k[0] in ("cudagraph", "compile", "compile-ro"))
# The post's own compiled configuration: reduce-overhead with AdamW left eager (PyTorch's default).
POST_CONFIG = ("compile-ro", "default")
TIE_BAND = 0.02  # a range inside 1 +- 2% is a tie
MIN_RUNS, MIN_MACHINES = 3, 2

_COLUMNS = ["device_slug", "device", "run_id", "machine_id", "host_cpu", "commit", "date", "label", "precision", "mode",
            "optimizer_kind", "config", "B", "T", "median_ms", "p20_ms", "p80_ms", "status", "check_ok",
            "first_step_s", "compiled_graphs", "graph_breaks", "cudagraph_skips", "ident", "engine_config"]


def config_name(mode: str, optimizer: str | None) -> str:
    return CONFIG_NAMES.get((mode, optimizer or "default"), f"{mode}, {optimizer}")


def frame(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Rows of the suite as a tidy table, one row per measurement (``ident``: what, whichever run)."""
    recs = []
    for r in rows:
        if "run_id" not in r:
            continue  # rows from before runs were recorded cannot be paired
        engine = engine_config(r)
        config = config_name(r["mode"], r.get("optimizer_kind"))
        if engine not in ("", TODAY):  # another engine than the current one: its own configuration, never pooled
            config = f"{config}, {engine}"
        recs.append({**{c: r.get(c) for c in _COLUMNS}, "ident": case_ident(r), "config": config,
                     "engine_config": engine})
    return pd.DataFrame.from_records(recs, columns=_COLUMNS)


def complete_runs(df: pd.DataFrame, cases: Sequence[Case], bench: str = SUITE,
                  require_clean: bool = True) -> pd.DataFrame:
    """Only the rows of runs that hold every case of ``cases`` and come from one clean commit.

    A configuration of ``LATER_STEP_CONFIGS`` (added to the suite after runs were stored without it)
    is kept where a run measured it and not required where it did not.

    Completeness is judged per precision and model: every configuration of a model in a
    precision, or none of its rows. A run cut short in fp16 keeps the precisions it finished, and
    a run that measured one precision only (a T4 chapter's profile) counts for that precision.
    A comparison of two models then needs both to be complete in the run (``model_speedups``
    pairs within a run only).
    """
    if df.empty:
        return df
    want: dict[tuple[str, str], set[str]] = {}
    later: dict[tuple[str, str], set[str]] = {}  # configurations added after runs were stored without them
    for c in cases:
        into = later if (c.mode, c.optimizer) in LATER_STEP_CONFIGS else want
        into.setdefault((c.precision, c.label), set()).add(c.ident(bench))
    keep = []
    for (_, _, prec, label), g in df.groupby(["device_slug", "run_id", "precision", "label"], sort=False):
        commits = set(g["commit"])
        clean = len(commits) == 1 and is_clean_commit(next(iter(commits)))
        need = want.get((prec, label))
        if need and need <= set(g["ident"]) and (clean or not require_clean):
            keep.append(g[g["ident"].isin(need | later.get((prec, label), set()))])
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


def valid_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that measured a step that computes what eager computes (status ok, loss check passed)."""
    return df[(df["status"] == "ok") & (df["check_ok"] == True)]  # noqa: E712 - None is not True


def todays_engine(df: pd.DataFrame) -> pd.DataFrame:
    """The valid engine rows that ran the current engine (the only ones an engine ratio may use)."""
    v = valid_rows(df)
    return v[(v["mode"] == "engine") & (v["engine_config"] == TODAY)]


def _fastest_per_run(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.Series]:
    """Per (device, run, model, precision): the fastest baseline configuration and its time; and, per run, the
    set of baseline configurations it measured."""
    base = valid_rows(df)
    base = base[[(m, o) in BASELINE_CONFIGS for m, o in zip(base["mode"], base["optimizer_kind"])]]
    run_keys = ["device_slug", "run_id", "label", "precision"]
    if base.empty:
        return (pd.DataFrame(columns=["device_slug", "run_id", "machine_id", "label", "precision", "baseline",
                                      "baseline_ms"]), pd.Series(dtype=object))
    idx = base.groupby(run_keys)["median_ms"].idxmin()
    best = base.loc[idx, ["device_slug", "run_id", "machine_id", "label", "precision", "config", "median_ms"]]
    best = best.rename(columns={"config": "baseline", "median_ms": "baseline_ms"}).reset_index(drop=True)
    return best, base.groupby(run_keys)["config"].agg(frozenset)


def _lacks_a_winner(best: pd.DataFrame, measured: pd.Series) -> pd.Series:
    """Per row of ``best``: the configurations that were the strongest in another run of its device, model and
    precision but that this run did not measure (an empty set: none)."""
    won = best.groupby(["device_slug", "label", "precision"])["baseline"].agg(frozenset)
    return pd.Series([won[(d, m, p)] - measured[(d, r, m, p)] for d, r, m, p in
                      zip(best["device_slug"], best["run_id"], best["label"], best["precision"])], index=best.index,
                     dtype=object)


def strongest(df: pd.DataFrame) -> pd.DataFrame:
    """Per (device, run, model, precision): the fastest baseline configuration and its time.

    A run that did not measure a configuration which was the strongest in another run of the same device,
    model and precision (one added to the suite after it, say) has no strongest baseline: its fastest would
    be of a weaker set (:func:`runs_left_out` says which runs and why)."""
    best, measured = _fastest_per_run(df)
    return best[_lacks_a_winner(best, measured).map(len) == 0].reset_index(drop=True) if len(best) else best


def runs_left_out(df: pd.DataFrame) -> pd.DataFrame:
    """The runs :func:`strongest` leaves out, per device, model and precision: how many, and the configurations
    they lack that were the strongest elsewhere."""
    cols = ["device_slug", "label", "precision", "runs left out", "lacking"]
    best, measured = _fastest_per_run(df)
    if best.empty:
        return pd.DataFrame(columns=cols)
    lack = _lacks_a_winner(best, measured)
    out = best.assign(lacking=lack.map(lambda s: ", ".join(sorted(s))))[lack.map(len) > 0]
    return (out.groupby(["device_slug", "label", "precision", "lacking"])["run_id"].nunique()
            .rename("runs left out").reset_index()[cols])


def speedups(df: pd.DataFrame, mode: str = "engine", optimizer: str = "default") -> pd.DataFrame:
    """Per run: the (mode, optimizer) configuration against the strongest baseline of the same run."""
    best = strongest(df)
    mine = valid_rows(df)
    mine = mine[(mine["mode"] == mode) & (mine["optimizer_kind"] == optimizer)]
    mine = mine[["device_slug", "run_id", "label", "precision", "median_ms", "engine_config"]]
    out = mine.merge(best, on=["device_slug", "run_id", "label", "precision"], how="inner")
    out["speedup"] = out["baseline_ms"] / out["median_ms"]
    return out


def enough_runs(n_runs: int, n_machines: int) -> bool:
    """Whether a verdict may be given: at least MIN_RUNS runs on MIN_MACHINES machine starts."""
    return n_runs >= MIN_RUNS and n_machines >= MIN_MACHINES


def runs_on_starts(n_runs: int, n_machines: int) -> str:
    """'1 run on 1 machine start', '3 runs on 2 machine starts'."""
    return f"{n_runs} run{'s' * (n_runs != 1)} on {n_machines} machine start{'s' * (n_machines != 1)}"


def verdict(lo: float, hi: float, n_runs: int, n_machines: int) -> str:
    """'faster', 'slower' or 'ties' when every run agrees (and there are enough of them)."""
    if not enough_runs(n_runs, n_machines):
        return f"too few runs ({runs_on_starts(n_runs, n_machines)}; a verdict needs {MIN_RUNS} on {MIN_MACHINES})"
    if 1 - TIE_BAND <= lo and hi <= 1 + TIE_BAND:
        return "ties"
    if lo > 1:
        return "faster"
    if hi < 1:
        return "slower"
    return "no verdict: the runs disagree"


def verdict_word(text: str) -> str:
    """A :func:`verdict` without its parenthesis: 'too few runs (1 run on 1 machine start; ...)' -> 'too few runs'."""
    return text.split(" (")[0]


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
    """The engine against the strongest baseline, per device, model, precision and engine configuration
    (``engine_config``: the current defaults, or which of them an earlier engine lacked), over runs; per
    device, model and precision the current engine first, then the earlier ones, fewest options missing first."""
    keys = ["device_slug", "label", "precision", "engine_config"]
    per_run = speedups(df)
    if per_run.empty:
        return spread(per_run, keys)
    tab = spread(per_run, keys)
    ms = per_run.groupby(keys).agg(
        engine_ms=("median_ms", "median"), baseline_ms=("baseline_ms", "median"),
        baseline=("baseline", lambda s: " / ".join(sorted(set(s))))).reset_index()  # the runs' fastest, each
    out = ms.merge(tab, on=keys)
    order = [(c != TODAY, c.count(",")) for c in out["engine_config"]]
    out = out.assign(_order=order).sort_values(["device_slug", "label", "precision", "_order"], kind="stable")
    return out.drop(columns="_order").reset_index(drop=True)


def newest_engine(tab: pd.DataFrame) -> pd.DataFrame:
    """One line of :func:`engine_table` per device, model and precision: the current engine where a run measured
    it, else the earlier engine closest to it (its ``engine_config`` says which)."""
    return tab.groupby(["device_slug", "label", "precision"], sort=False).head(1).reset_index(drop=True)


def engine_note(config: str) -> str:
    """'' for the current engine, else ' (an earlier engine, N of today's default options off ...)' to put beside
    its numbers (:func:`ftlib.views.engine_config.engine_words`)."""
    return "" if config == TODAY else f" ({engine_words(config)})"


def model_speedups(df: pd.DataFrame, faster: str = "fasttransformer", slower: str = "gpt2") -> pd.DataFrame:
    """Per run and configuration: how much faster ``faster`` steps than ``slower`` (same run, mode, precision).

    Also the two models each at its own strongest baseline (config ``'strongest baseline'``).
    """
    v = valid_rows(df)
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
    v = valid_rows(df)
    if v.empty:
        return pd.DataFrame(columns=["device_slug", "label", "precision", "config", "median_ms", "min_ms",
                                     "max_ms", "runs"])
    g = v.groupby(["device_slug", "label", "precision", "config"], sort=False)
    return g.agg(median_ms=("median_ms", "median"), min_ms=("median_ms", "min"), max_ms=("median_ms", "max"),
                 runs=("run_id", "nunique")).reset_index()


def runs_table(df: pd.DataFrame) -> pd.DataFrame:
    """The runs behind a table: device, machine start, commit, date and rows, one line per run."""
    if df.empty:
        return pd.DataFrame(columns=["device", "run_id", "machine_id", "commit", "date", "rows"])
    g = df.groupby(["device", "run_id"], sort=False)
    out = g.agg(machine_id=("machine_id", "first"), commit=("commit", "first"), date=("date", "min"),
                rows=("ident", "size")).reset_index()
    out["date"] = out["date"].str[:10]
    return out


def fmt_range(median: float, lo: float, hi: float, unit: str = "×") -> str:
    """'1.29× (1.12–1.32×)': a median over runs with its min and max; '1.29×' alone where they agree to
    two decimals (one run, say)."""
    if f"{lo:.2f}" == f"{hi:.2f}":
        return f"{median:.2f}{unit}"
    return f"{median:.2f}{unit} ({lo:.2f}–{hi:.2f}{unit})"


def runs_note(runs: int, machines: int) -> str:
    return f"{runs} run{'s' * (runs != 1)}, {machines} machine start{'s' * (machines != 1)}"


def range_text(median: float, lo: float, hi: float) -> str:
    """'1.29× (1.12–1.32× over runs)', or just '1.50×' when every run gave the same to 2 decimals."""
    if f"{lo:.2f}" == f"{hi:.2f}":
        return f"{median:.2f}×"
    return f"{median:.2f}× ({lo:.2f}–{hi:.2f}× over runs)"


def lookup_row(tab: pd.DataFrame, **match: Any) -> pd.Series | None:
    sel = tab
    for k, v in match.items():
        sel = sel[sel[k] == v]
    return None if sel.empty else sel.iloc[0]


def headroom(df: pd.DataFrame) -> pd.DataFrame:
    """Per device, model and precision: eager, the manual CUDA graph, the fastest compiled step and the
    engine, against the floors of the step (chapter 2's accounting at the device's datasheet peaks).

    ``eager-step floor ms`` is chapter 2's sum of every component's roofline bound with the bytes an eager
    step moves; ``compiled / eager-step floor`` is how far the fastest compiled step stays above it. A step
    that fuses ops moves fewer bytes and can go below it.
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
        b = lookup_row(best, device_slug=dev, label=label, precision=prec)
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
                    "eager step in a CUDA graph ms": t.get(config_name("cudagraph", "fused")),
                    "fastest compiled ms": compiled, "engine ms": t.get(config_name("engine", "default")),
                    "FLOP floor ms": flops_floor(palm_flops(cfg, B, T), peaks, prec) * 1e3,
                    "eager-step floor ms": roof,
                    "compiled / eager-step floor": None if compiled is None else compiled / roof})
    return pd.DataFrame(out)


