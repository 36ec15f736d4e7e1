"""The training studies' rows read back (chapter 8): losses over seeds, per model and device
(the speedrun's verdicts, curves and repeats: :mod:`ftlib.views.speedrun`).

Seeds are pooled only within one device and one model config, so a smoke run's tiny model stored
under a full-size name never mixes with it, and nor do two GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import plotly.graph_objects as go

from ftlib.harness.convergence import steady_time_at, steady_time_to_target
from ftlib.harness.results import load_rows
from ftlib.harness.studies import is_smoke, suites
from ftlib.views.bench import gpu_label, gpu_of, model_title
from ftlib.views.plots import MODEL_COLORS, PALETTE, with_subtitle
from ftlib.views.tables import group_rows, table_view


def ok_runs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of finished runs (failed runs are stored too, with status 'error' and no history)."""
    return [r for r in rows if r.get("status", "ok") == "ok"]


def mean_of(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _runs_of_one_config(rows: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """Finished runs grouped by (device, model, config hash): the seeds of one model at one size on
    one device, never pooled with another device's runs or a smoke run's smaller model."""
    return group_rows(ok_runs(rows), "device_slug", "model", "config_hash")


def aggregate(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per model, per evaluated step: mean, min and max over seeds of val/train loss and time.

    Seeds are pooled only within one device and one config. Each entry is named as the book names the
    model (:func:`~ftlib.views.bench.model_title`); where a model name has runs on several devices or at
    several sizes, each gets its own entry, named with its device and parameter count too.
    """
    groups = _runs_of_one_config(rows)
    names = [model for _, model, _ in groups]
    out: dict[str, list[dict[str, Any]]] = {}
    for (dev, model, _), rs in groups.items():
        name = model_title(model)
        if names.count(model) > 1:
            name += f" ({gpu_label(dev)}, {rs[0].get('params', 0):,} params)"
        by_step: dict[int, list[dict]] = {}
        steady: dict[int, list[float]] = {}  # the clock without the run's startup, where every run recorded it
        timed = all(r.get("startup_s") is not None for r in rs)
        for r in rs:
            for ev in r["history"]:
                by_step.setdefault(ev["step"], []).append(ev)
                if timed:
                    # From step 1 on the clock holds the startup (build and first step): a cold
                    # compile cache pays it once per process, so seeds differ by it, not by their steps.
                    steady.setdefault(ev["step"], []).append(max(ev["time_s"] - r["startup_s"], 0.0))
        pts = []
        for step in sorted(by_step):
            evs = by_step[step]
            vals = [e["val_loss"] for e in evs]
            st = steady.get(step)
            pts.append({
                "step": step, "tokens": evs[0]["tokens"], "n_seeds": len(evs),
                "time_s": sum(e["time_s"] for e in evs) / len(evs),
                "steady_s": sum(st) / len(st) if st else None,
                "val_mean": sum(vals) / len(vals), "val_min": min(vals), "val_max": max(vals),
                "train_mean": sum(e["train_loss"] for e in evs) / len(evs),
            })
        out[name] = pts
    return out


def _colors(agg: dict[str, Any]) -> dict[str, str]:
    """A colour per entry of :func:`aggregate`: the book's colour of its model where it has one."""
    own = {model_title(k): v for k, v in MODEL_COLORS.items()}
    return {m: own.get(m) or PALETTE[2 + i] for i, m in enumerate(agg)}


@table_view
def seed_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per device, model and config: seeds, best validation loss (mean, min, max), training time.

    For runs aimed at a target loss (a speedrun), the time to it twice: all training-step wall time (startup
    included), and without the startup (first step: compilation, or the engine's JIT and capture); a row
    without a recorded startup has no value for the second, and its mean is over the seeds that have one.
    Runs without a target have no such columns: they train a fixed number of steps. The startup stands
    beside the training time wherever the rows record it, since the training time includes it.
    Runs of different devices or sizes are separate lines (``device``, ``params``).
    """
    groups = _runs_of_one_config(rows)
    speedrun = any(r.get("target") is not None for rs in groups.values() for r in rs)  # else no target columns
    table = []
    for (dev, model, _), rs in groups.items():
        best = [r["best_val_loss"] for r in rs]
        line = {"device": dev, "model": model, "params": rs[0]["params"], "seeds": len(rs),
                "best val loss (mean)": sum(best) / len(best), "min": min(best), "max": max(best)}
        if speedrun:
            ttt = [r["time_to_target_s"] for r in rs if r.get("time_to_target_s") is not None]
            line["time to target s (mean)"] = sum(ttt) / len(ttt) if ttt else None
            line["excl. startup s (mean)"] = mean_of([steady_time_to_target(r) for r in rs])
            line["steps to target (mean)"] = mean_of([r.get("steps_to_target") for r in rs])
            line["reached"] = f"{len(ttt)}/{len(rs)}"
        line["train time s (mean)"] = sum(r["train_time_s"] for r in rs) / len(rs)
        if speedrun or any(r.get("startup_s") is not None for r in rs):
            line["startup s (mean)"] = mean_of([r.get("startup_s") for r in rs])
        table.append(line)
    return table


def suite_rows(bench: str, rows: Iterable[dict[str, Any]], smoke: bool = False) -> list[dict[str, Any]]:
    """The rows of ``bench`` at the suite's size (``smoke`` picks which).

    A smoke run stores tiny models under the same names as the full-size ones: a row of a model the
    suite still runs must have that model's config hash at that size; a row of a candidate no longer
    listed is kept by its size alone (it is labelled by its own ``model`` field). Repeats are matched
    against the runs they repeat.
    """
    table = suites(smoke)
    if bench not in table:
        return list(rows)
    runs = table[table[bench].get("repeat_of") or bench]["runs"]
    return [r for r in rows if (r.get("config_hash") == runs[r["model"]][0].config_hash() if r.get("model") in runs
                                else bench.startswith("speedrun") and is_smoke(r.get("config") or {}) == smoke)]


def stored_rows(bench: str, device: str | None = None, smoke: bool = False) -> list[dict[str, Any]]:
    """A study's rows at its size (:func:`suite_rows`): one device folder's, or (None) every GPU's."""
    rows = load_rows(bench, devices=None if device is None else [device])
    return suite_rows(bench, rows, smoke=smoke)


@table_view
def original_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The post's experiment per run: the post's perplexity (exp of the last training batch's loss) beside
    the training and held-out perplexities."""
    return [{"device": r["device_slug"], "model": r["model"], "params": r["params"], "seed": r["seed"],
             "steps": r["steps_done"],
             "post's perplexity exp(batch loss)": math.exp(r["history"][-1]["batch_loss"]),
             "train perplexity exp(train loss)": math.exp(r["history"][-1]["train_loss"]),
             "validation perplexity exp(val loss)": math.exp(r["history"][-1]["val_loss"])}
            for r in sorted(rows, key=lambda r: (r["device_slug"], r["seed"], r["model"]))]


ORIGINAL_PREVIEW = ("device", "model", "seed", "post's perplexity exp(batch loss)", "train perplexity exp(train loss)",
                    "validation perplexity exp(val loss)")


def loss_figures(rows: list[dict[str, Any]]) -> list[tuple[str, go.Figure]]:
    """(name, figure) per device and x axis (step, tokens, training time without the startup, as the
    speedrun's figures count it): validation loss, the mean over seeds with the min–max range as bars, the
    axis from the lowest loss to the second evaluation's."""
    out = []
    for dev, dev_rows in group_rows(rows).items():
        agg = aggregate(dev_rows)
        colors = _colors(agg)
        axes = [("step", "optimizer step"), ("tokens", "tokens seen"),
                ("steady_s", "training time excluding startup (s)")]
        for axis, label in axes:
            fig = go.Figure()
            for model, pts in agg.items():
                pts = [p for p in pts if p[axis] is not None]
                fig.add_trace(go.Scatter(x=[p[axis] for p in pts], y=[p["val_mean"] for p in pts], mode="lines",
                                         name=model, line=dict(color=colors[model]),
                                         error_y=dict(type="data", symmetric=False, thickness=1,
                                                      array=[p["val_max"] - p["val_mean"] for p in pts],
                                                      arrayminus=[p["val_mean"] - p["val_min"] for p in pts])))
            # The first evaluations (loss ~4) squash the end, where the models differ.
            lows = [p["val_min"] for pts in agg.values() for p in pts]
            second = [pts[1]["val_max"] for pts in agg.values() if len(pts) > 1] or [max(lows)]
            top = max(second) + 0.05
            highest = max(p["val_max"] for pts in agg.values() for p in pts)
            cut = (f"the axis stops at {top:.2f}: the first evaluation (up to {highest:.2f}) runs off the top"
                   if highest > top else "")
            fig.update_layout(xaxis_title=label, yaxis_title="validation loss", height=440,
                              yaxis_range=[min(lows) - 0.05, top])
            with_subtitle(fig, f"Validation loss vs {label}, {gpu_label(dev)} (mean, min–max over seeds)", cut)
            out.append((f"convergence-val-{axis}-{dev}", fig))
    return out


def gap_figures(rows: list[dict[str, Any]], base: str = "gpt2") -> list[tuple[str, go.Figure]]:
    """(name, figure) per device where ``base`` ran: each other model's validation loss minus ``base``'s at
    the same step, both the mean over their seeds (step 0, the untrained models, left out), with ``base``'s
    own min–max range over seeds drawn around zero as a grey band: a gap inside it is within the seeds' spread."""
    out = []
    for dev, dev_rows in group_rows(rows).items():
        agg, name = aggregate(dev_rows), model_title(base)
        if name not in agg:
            continue
        ref = {p["step"]: p for p in agg[name] if p["step"] > 0}
        steps = sorted(ref)
        colors = _colors(agg)
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=steps + steps[::-1], y=[ref[s]["val_max"] - ref[s]["val_mean"] for s in steps]
                                 + [ref[s]["val_min"] - ref[s]["val_mean"] for s in steps[::-1]],
                                 fill="toself", fillcolor="rgba(128,128,128,0.2)", line=dict(width=0),
                                 name=f"{name}'s own seed range", hoverinfo="skip"))
        for model, pts in agg.items():
            if model == name:
                continue
            pts = [p for p in pts if p["step"] in ref]
            fig.add_trace(go.Scatter(x=[p["step"] for p in pts], y=[p["val_mean"] - ref[p["step"]]["val_mean"]
                                                                    for p in pts],
                                     mode="lines+markers", name=model, line=dict(color=colors[model])))
        fig.add_hline(y=0, line_color="#444", line_width=1)
        fig.update_layout(title=f"Validation loss minus {name}'s at the same step, {gpu_label(dev)} (means over seeds)",
                          xaxis_title="optimizer step", yaxis_title=f"validation loss − {name}'s", height=440)
        out.append((f"convergence-val-gap-{dev}", fig))
    return out


def train_val_figures(rows: list[dict[str, Any]]) -> list[tuple[str, go.Figure]]:
    """(name, figure) per device and model: training and validation loss per step, mean over seeds."""
    out = []
    for dev, dev_rows in group_rows(rows).items():
        for name, pts in aggregate(dev_rows).items():
            fig = go.Figure([
                go.Scatter(x=[p["step"] for p in pts], y=[p["val_mean"] for p in pts], name="validation"),
                go.Scatter(x=[p["step"] for p in pts], y=[p["train_mean"] for p in pts], name="train",
                           line=dict(dash="dash")),
            ])
            fig.update_layout(title=f"{name}: train and validation loss, {gpu_label(dev)} (mean over seeds)",
                              xaxis_title="step", yaxis_title="loss", height=400)
            out.append((f"convergence-nanogpt-{dev}", fig))
    return out


@table_view
def checkpoint_table(check: dict[str, Any], label: str | None = None) -> list[dict[str, Any]]:
    """A checkpoint round trip's result (``ftlib.harness.convergence.checkpoint_roundtrip``), its sample and
    config aside: the model by ``label`` (its name by default), and what was trained, a tiny smoke model
    (its config is the smoke size, ``ftlib.harness.studies.SMOKE_MODEL``) or the candidate at full size."""
    cfg = check.get("config") or {}
    size = (f"tiny smoke model: {cfg.get('n_layer')} layer of width {cfg.get('n_embd')}, not the candidate"
            if is_smoke(cfg) else f"full size: {cfg.get('n_layer')} layers of width {cfg.get('n_embd')}")
    return [{"model": label or check["model"], "trained": size,
             **{k: v for k, v in check.items() if k not in ("sample", "config", "model")}}]


def _pair(rows: list[dict[str, Any]], device: str) -> tuple[list[dict], list[dict]] | None:
    """FastTransformer's and GPT-2's finished runs on ``device``, or None unless each has runs of one config."""
    mine = [(m, rs) for (dev, m, _), rs in _runs_of_one_config(rows).items() if dev == device]
    sizes, groups = [m for m, _ in mine], dict(mine)
    if any(sizes.count(m) != 1 for m in ("fasttransformer", "gpt2")):
        return None
    return groups["fasttransformer"], groups["gpt2"]


def _welch_words(a: list[float], b: list[float]) -> str:
    """'; Welch's t-test over n and m seeds gives p = ...: ...' on two samples, or '' (no verdict) where
    either has fewer than two values or neither has any spread."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2 or (len(set(a)) == 1 and len(set(b)) == 1):
        return ""
    p = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    if math.isnan(p):  # no spread on either side: the test is undefined
        return ""
    tell = "a difference the seeds can tell apart" if p < 0.05 else "no difference the seeds can tell apart"
    return f"; Welch's t-test over {len(a)} and {len(b)} seeds gives p = {p:.2g}: {tell}"


def _spread(values: list[float], digits: int = 2) -> str:
    """'12.17 (12.13–12.20)': the mean and, with more than one value, the range."""
    mean, lo, hi = sum(values) / len(values), f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return f"{mean:.{digits}f}" + (f" ({lo}–{hi})" if lo != hi else "")


def _seeds(runs: list[dict[str, Any]]) -> str:
    seeds = sorted(r["seed"] for r in runs)
    return f"seed {seeds[0]}" if len(seeds) == 1 else "seeds " + ", ".join(map(str, seeds[:-1])) + f" and {seeds[-1]}"


def original_findings(rows: list[dict[str, Any]], run_command: str) -> str:
    """The post's own experiment in words, per device: FastTransformer against GPT-2 at the last step, by the
    post's perplexity (exp of the last training batch's loss) and by the held-out one (exp of the validation
    loss), each the mean and range over the seeds, with Welch's t-test on the validation losses where each
    model has at least two seeds."""
    devices = sorted({r["device_slug"] for r in ok_runs(rows)})
    lines = []
    for dev in devices:
        pair = _pair(rows, dev)
        if pair is None:
            continue
        (ft, g2), last = pair, (lambda r: r["history"][-1])
        steps = sorted({last(r)["step"] for r in ft + g2})
        post = [[math.exp(last(r)["batch_loss"]) for r in rs] for rs in (ft, g2)]
        held = [[math.exp(last(r)["val_loss"]) for r in rs] for rs in (ft, g2)]
        lower = ("FastTransformer" if sum(held[0]) / len(ft) < sum(held[1]) / len(g2) else "GPT-2")
        lines.append(
            f"On the {gpu_label(dev)}, the post's experiment after {'/'.join(map(str, steps))} steps "
            f"(FastTransformer {_seeds(ft)}, "
            f"GPT-2 {_seeds(g2)}): the post's perplexity, exp(loss of the last training batch), is "
            f"{_spread(post[0])} for FastTransformer against {_spread(post[1])} for GPT-2; the held-out "
            f"perplexity, exp(validation loss), {_spread(held[0])} against {_spread(held[1])}, lower for {lower}"
            + _welch_words([last(r)["val_loss"] for r in ft], [last(r)["val_loss"] for r in g2]) + ".")
    return "\n".join(lines) or f"The post's experiment has no stored rows: `{run_command}` on a GPU measures it."


def _steady_at(run: dict[str, Any], loss: float) -> tuple[int, float] | None:
    """(step, training-step seconds excluding the startup) of a run's first evaluation at or below ``loss``."""
    h = next((h for h in run["history"] if h["val_loss"] <= loss + 1e-12), None)
    t = None if h is None else steady_time_at(h, run.get("startup_s"))
    return None if t is None else (h["step"], t)


def _steady_last(run: dict[str, Any]) -> tuple[int, float] | None:
    """(step, training-step seconds excluding the startup) of a run's last evaluation."""
    if not run["history"] or run.get("startup_s") is None:
        return None
    h = run["history"][-1]
    return h["step"], max(h["time_s"] - run["startup_s"], 0.0)


def same_loss_times(rows: list[dict[str, Any]], device: str) -> str:
    """The fair comparison's wall clock on ``device``, FastTransformer against GPT-2, startup excluded: the
    time of each run's steps, and the time to a validation loss every seed of both reaches (the highest of
    their best losses), each with Welch's t-test where both have two seeds or more; then the whole runs'
    time with the startup. '' where either has no run or a run records no startup."""
    pair = _pair(rows, device)
    if pair is None or not pair[0] or not pair[1]:
        return ""
    ft, g2 = pair
    loss = max(r["best_val_loss"] for r in ft + g2)
    at = [[_steady_at(r, loss) for r in rs] for rs in (ft, g2)]
    last = [[_steady_last(r) for r in rs] for rs in (ft, g2)]
    if any(a is None for side in at + last for a in side):
        return ""

    def versus(a: list[float], b: list[float]) -> str:
        return (f"{_spread(a, 1)} s for FastTransformer against {_spread(b, 1)} s for GPT-2, "
                f"GPT-2's {(sum(b) / len(b)) / (sum(a) / len(a)):.2f}× as long" + _welch_words(a, b))

    steps = sorted({s for side in last for s, _ in side})
    (t_ft, t_g2), (s_ft, s_g2) = ([[a[k] for a in side] for side in at] for k in (1, 0))
    whole = [[r["train_time_s"] for r in rs] for rs in (ft, g2)]
    return (f"Wall clock on the {gpu_of(rows, device)}, startup excluded: the {'/'.join(map(str, steps))} steps "
            "of a run took "
            + versus(*([t for _, t in side] for side in last))
            + f". To validation loss {loss:.4f}, which every seed of both reaches: " + versus(t_ft, t_g2)
            + f" (at step {_spread(s_ft, 0)} against {_spread(s_g2, 0)}: near the loss floor, the step at which a "
            "seed first reaches a loss varies from seed to seed). With the startup, which a cold compile "
            f"cache makes long on a process's first seed, the whole runs took {_spread(whole[0], 1)} s against "
            f"{_spread(whole[1], 1)} s.")


def fair_findings(rows: list[dict[str, Any]], run_command: str) -> str:
    """The fair comparison in words, per device: each model's best validation loss over its seeds, lowest
    first, and FastTransformer's mean against GPT-2's (the post's "converges as well"). Where no row is
    stored, says so and how to measure it (``run_command``)."""
    table = seed_table.rows(ok_runs(rows))
    if not table:
        return f"The fair comparison has no stored rows: `{run_command}` on a GPU measures it."
    lines = []
    for dev in sorted({x["device"] for x in table}):
        mine = sorted((x for x in table if x["device"] == dev), key=lambda x: x["best val loss (mean)"])
        parts = [f"{model_title(x['model'])} {x['best val loss (mean)']:.4f} ("
                 + (f"{x['min']:.4f}–{x['max']:.4f}, {x['seeds']} seeds)" if x["seeds"] > 1 else "1 seed)")
                 for x in mine]
        lines.append(f"On the {gpu_label(dev)}, the best validation loss of each model, lowest first: "
                     + "; ".join(parts) + ".")
        by = {x["model"]: x for x in mine}
        if "fasttransformer" in by and "gpt2" in by:
            ft, g2 = by["fasttransformer"], by["gpt2"]
            gap = ft["best val loss (mean)"] - g2["best val loss (mean)"]
            overlap = ft["min"] <= g2["max"] and g2["min"] <= ft["max"]
            lines.append(f"FastTransformer's mean is {abs(gap):.4f} {'above' if gap > 0 else 'below'} GPT-2's; "
                         f"their seed ranges {'overlap' if overlap else 'do not overlap'}{_welch(rows, dev)}.")
        lines.append(same_loss_times(rows, dev))
    return "\n".join(line for line in lines if line)


def _welch(rows: list[dict[str, Any]], device: str) -> str:
    """:func:`_welch_words` on FastTransformer's and GPT-2's best losses over their seeds (one config each on
    ``device``), or '' where either has fewer than two seeds or several sizes."""
    pair = _pair(rows, device)
    return "" if pair is None else _welch_words(*([r["best_val_loss"] for r in rs] for rs in pair))
