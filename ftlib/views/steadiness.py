"""How steady the strongest compiled step is from run to run, beside the engine's.

A same-run ratio divides two rows of one run, which removes the drift of the GPU between runs. It does
not remove what each step's own time depends on: a compiled step whose graphs leave host work between
them (Python, guards, the autograd engine running the compiled backward as one node; ``graph_breaks``
in the rows) waits on the host once its GPU work is short, so its time follows the host the machine
start got (rows name its processor, ``host_cpu``). The engine replays one CUDA graph per step. Read
per device, model and precision, never pooled.
"""

from __future__ import annotations

import pandas as pd

from ftlib.views import baselines as bv
from ftlib.views.bench import gpu_label, model_title

_COLUMNS = ["device", "model", "precision", "runs", "strongest baseline ms (min–max)", "compiled spread %",
            "strongest configurations", "graph breaks", "host work each step", "hosts", "engine runs",
            "engine ms (min–max)", "engine spread %"]
STEADY_PCT = 5.0  # a strongest baseline whose runs lie further apart (max / min - 1) is not steady


def host_work(config: str, graph_breaks: int | None) -> str | None:
    """What a compiled configuration leaves to the host every step (None: nothing, one graph replay)."""
    if config.startswith("manual CUDA graph"):
        return None
    if "whole step" in config:
        return f"{graph_breaks} graph breaks" if graph_breaks else "the autograd engine between its graphs"
    if "outside" in config:
        return "AdamW launched from Python"
    return None


def _span(values: pd.Series) -> tuple[str, float]:
    lo, hi = float(values.min()), float(values.max())
    text = f"{values.median():.3f}" + (f" ({lo:.3f}–{hi:.3f})" if f"{lo:.3f}" != f"{hi:.3f}" else "")
    return text, 100.0 * (hi / lo - 1.0)


def _hosts(runs: pd.DataFrame) -> str | None:
    """'<host_cpu> (n runs); …' over the runs in ``runs`` whose rows name their host (None: none do)."""
    if "host_cpu" not in runs:
        return None
    named = runs.dropna(subset=["host_cpu"]).query("host_cpu != ''").drop_duplicates("run_id")
    counts = named["host_cpu"].value_counts()
    return "; ".join(f"{h} ({n} run{'s' if n != 1 else ''})" for h, n in counts.items()) or None


def steadiness_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per device, model and precision: the strongest baseline of each run (``baselines.strongest``: median,
    min–max over the runs, and max / min - 1 in %), which configurations it was, the most graph breaks its
    rows reported, the hosts its runs had (a column only where rows name them), and the current engine the
    same way."""
    best = bv.strongest(df)
    if best.empty:
        return pd.DataFrame(columns=_COLUMNS)
    v = bv.valid_rows(df)
    rows = best.merge(v[["device_slug", "run_id", "label", "precision", "config", "graph_breaks"]],
                      left_on=["device_slug", "run_id", "label", "precision", "baseline"],
                      right_on=["device_slug", "run_id", "label", "precision", "config"], how="left")
    engine = bv.todays_engine(df)
    out = []
    for (dev, label, prec), g in rows.groupby(["device_slug", "label", "precision"], sort=True):
        text, spread = _span(g["baseline_ms"])
        breaks = None if g["graph_breaks"].isna().all() else int(g["graph_breaks"].max())
        # Each configuration's own host work, with its own graph breaks; named where the strongest one varied.
        configs = g.groupby("baseline")["graph_breaks"].max()
        work = sorted({(f"{c}: {w}" if len(configs) > 1 else w) for c, n in configs.items()
                       if (w := host_work(c, None if pd.isna(n) else int(n)))})
        line = {"device": dev, "model": model_title(label), "precision": prec,
                "runs": g["run_id"].nunique(), "strongest baseline ms (min–max)": text,
                "compiled spread %": round(spread, 1) if g["run_id"].nunique() > 1 else None,  # one run: no spread
                "strongest configurations": "; ".join(f"{c} ({n})" for c, n in g["baseline"].value_counts().items()),
                "graph breaks": breaks, "host work each step": "; ".join(work) or None,
                "hosts": _hosts(v[(v["device_slug"] == dev) & v["run_id"].isin(g["run_id"])]),
                "engine runs": 0, "engine ms (min–max)": None, "engine spread %": None}
        e = engine[(engine["device_slug"] == dev) & (engine["label"] == label) & (engine["precision"] == prec)]
        if len(e):
            etext, espread = _span(e["median_ms"])
            line.update({"engine runs": e["run_id"].nunique(), "engine ms (min–max)": etext,
                         "engine spread %": round(espread, 1) if e["run_id"].nunique() > 1 else None})
        out.append(line)
    tab = pd.DataFrame(out, columns=_COLUMNS)
    return tab.drop(columns="hosts") if tab["hosts"].isna().all() else tab  # rows from before hosts were named


def steadiness_findings(df: pd.DataFrame, model: str = "fasttransformer", steady_pct: float = STEADY_PCT,
                        precisions: tuple[str, ...] | None = None) -> str:
    """Markdown, one item per device and precision of ``model``: how far apart the strongest baseline
    of its runs lies, and whether that is more than ``steady_pct`` %: then the same-run ratio also measures
    the host of each machine start, and the spread of the ratio over runs says how much."""
    tab = steadiness_table(df)
    name = model_title(model)
    tab = tab[(tab["model"] == name) & (tab["runs"] > 1)]
    if precisions is not None:
        tab = tab[tab["precision"].isin(precisions)]
    lines = []
    for _, r in tab.iterrows():
        spread, n_engine = r["compiled spread %"], int(r["engine runs"])
        engine = (f"; the current engine {r['engine ms (min–max)']} ms over {n_engine} "
                  f"run{'s' if n_engine != 1 else ''}" if n_engine else "")
        if spread <= steady_pct:
            verdict = "steady"
        else:
            verdict = f"more than {steady_pct:g}% apart"
            if r["host work each step"]:
                verdict += (f". The strongest configurations of these runs leave work to the host every step "
                            f"({r['host work each step']}), so their time, and the engine's ratio against them, "
                            "depend on the host the run got")
                if isinstance(r.get("hosts"), str):  # NaN where another model's runs named their hosts
                    verdict += f" (hosts: {r['hosts']})"
        lines.append(f"- **{gpu_label(r['device'])}, {name}, {r['precision']}:** the strongest baseline took "
                     f"{r['strongest baseline ms (min–max)']} ms over {r['runs']} runs, "
                     # one decimal under 10%, so that a spread just past the threshold does not print as it
                     f"{spread:.{1 if spread < 10 else 0}f}% from fastest "
                     f"to slowest run: {verdict}{engine}.")
    return "\n".join(lines)
