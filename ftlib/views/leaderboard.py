"""The speedrun's leaderboard (chapter 8): the rules of the public speedruns applied to the rows.

The rules follow the public NanoGPT speedrun (modded-nanogpt) README: the claimed time is training-step
time only (compilation, kernel JIT and warm-up are untimed and reported apart), averaged over seeds;
a claim needs p < 0.01 that the seeds' mean validation loss at the stop is at or below the target
(a one-sided one-sample t-test); and only the model and the recipe may change. Here the claimed time
of a run is ``time_to_target_excl_startup_s``: the training steps up to the first evaluation at or
below the target, the startup excluded. A candidate's time is claimed, ranked and compared with
nanoGPT's only where every seed it ran reached the target, at least ``CLAIM_SEEDS`` seeds ran and
p < ``SIGNIFICANCE``; the others are listed with the reason. Tables name candidates by their short
ids (:mod:`ftlib.views.candidates`). Rows of different devices are never pooled.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from scipy import stats

from ftlib.harness.convergence import steady_time_at
from ftlib.harness.studies import CLAIM_SEEDS, NANOGPT_BEST_LOSS, REFERENCE, SIGNIFICANCE, TARGET_LOSS
from ftlib.views.bench import gpu_label
from ftlib.views.candidates import id_of, in_words, short_ids
from ftlib.views.plots import PALETTE, legend_below
from ftlib.views.speedrun import speedrun_curves
from ftlib.views.tables import table_view

TARGETS = (TARGET_LOSS, NANOGPT_BEST_LOSS)
DID_NOT_REACH = "did not reach"
STOP_LOSS = "val loss at stop (mean)"  # every seed reached the target: the loss that stopped each
ENDED_LOSS = "val loss at stop or last eval (mean)"  # some seed did not: its last evaluation counts
NOT_CLAIMED = "not claimed because"
SIGNIFICANT = f"p < {SIGNIFICANCE:g}"


def stop_of(row: dict[str, Any], target: float) -> dict[str, Any] | None:
    """Where a run aimed at ``target`` stops: its first evaluation at or below it, else its last one.

    Gives ``reached``, ``step``, ``tokens``, ``time_s`` (training-step time excluding the startup,
    :func:`ftlib.harness.convergence.steady_time_to_target` where the row stopped there; None where
    the row records no startup), ``val_loss`` (the sampled estimate) and ``full_val_loss`` (the whole
    validation split, recorded only at the row's own stop). None for a failed run (no history).
    """
    hist = row.get("history") or []
    if row.get("status", "ok") != "ok" or not hist:
        return None
    h = next((h for h in hist if h["val_loss"] <= target), None)
    if h is None:
        return {"reached": False, "step": None, "tokens": None, "time_s": None, "val_loss": hist[-1]["val_loss"],
                "full_val_loss": None}
    at_stop = row.get("steps_to_target") == h["step"]  # the row's own stop: its stored fields apply
    if at_stop and row.get("time_to_target_excl_startup_s") is not None:
        time_s = row["time_to_target_excl_startup_s"]
    else:  # the rule the row's own stop was recorded with
        time_s = steady_time_at(h, row.get("startup_s"))
    tokens = row.get("tokens_to_target") if at_stop and row.get("tokens_to_target") is not None else h["tokens"]
    return {"reached": True, "step": h["step"], "tokens": tokens, "time_s": time_s, "val_loss": h["val_loss"],
            "full_val_loss": row.get("full_val_loss_at_target") if at_stop else None}


def aims_at(row: dict[str, Any], target: float) -> bool:
    """Whether a run says something about ``target``: one stopped at a higher loss never had the chance."""
    own = row.get("target")
    return own is None or own <= target + 1e-12


def p_value(losses: Sequence[float] | pd.Series, target: float) -> float | None:
    """p of a one-sided one-sample t-test that the mean of ``losses`` is below ``target`` (scipy);
    None with fewer than two losses, or where the test is undefined (no spread)."""
    losses = list(losses)
    if len(losses) < 2 or len(set(losses)) == 1:
        return None
    p = float(stats.ttest_1samp(losses, target, alternative="less").pvalue)
    return None if math.isnan(p) else p


def one_run_per_seed(rows: Iterable[dict[str, Any]], target: float) -> list[dict[str, Any]]:
    """The runs that aim at ``target`` (:func:`aims_at`), one per (model, config, seed): where a seed ran
    twice, the run aimed at this target rather than the one aimed lower."""
    runs = sorted((r for r in rows if aims_at(r, target)),
                  key=lambda r: r.get("target") is not None and abs(r["target"] - target) > 1e-12)
    out, seen = [], set()
    for r in runs:
        ident = (r.get("model"), r.get("config_hash"), r.get("seed"))
        if r.get("seed") is not None and ident in seen:
            continue
        seen.add(ident)
        out.append(r)
    return out


def seed_stops(rows: list[dict[str, Any]], target: float) -> pd.DataFrame:
    """One line per seed of each candidate among the runs that aim at ``target`` (:func:`aims_at`): its
    candidate and seed and :func:`stop_of`; a failed run counts as a seed that did not reach. Names
    shared by runs of different configs get the parameter count added, so different sizes are never
    pooled. A seed run twice (once aimed at this target, once at a lower one, as the record suite
    re-runs candidates) is one sample, not two: the run aimed at this target is kept."""
    runs = one_run_per_seed(rows, target)
    hashes = pd.DataFrame({"model": [r.get("model") for r in runs], "h": [r.get("config_hash") for r in runs]})
    shared = set(hashes.groupby("model")["h"].nunique().loc[lambda n: n > 1].index) if runs else set()
    out = []
    for r in runs:
        s = stop_of(r, target) or {"reached": False}
        name = r["model"] + (f" ({r.get('params', 0):,} params)" if r["model"] in shared else "")
        out.append({"candidate": name, "model": r["model"], "seed": r.get("seed"), **s})
    cols = ["candidate", "model", "seed", "reached", "step", "tokens", "time_s", "val_loss", "full_val_loss"]
    return pd.DataFrame(out, columns=cols).astype({"reached": bool})


def _every(values: pd.Series) -> float | None:
    """The mean where every seed has a value, else None (a claim over some of the seeds is no claim)."""
    v = pd.to_numeric(values, errors="coerce")
    return float(v.mean()) if len(v) and v.notna().all() else None


def _p_every(values: pd.Series, target: float) -> float | None:
    """:func:`p_value` where every seed has a value, else None."""
    return p_value(values, target) if _every(values) is not None else None


def _num(v: Any) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


def on_device(rows: Iterable[dict[str, Any]], device: str) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("device_slug") == device]


def _why_not(seeds: int, reached: int, p: float | None) -> str | None:
    """Why a candidate's time is no claim (None where it is one): the rule needs every seed at the target,
    at least ``CLAIM_SEEDS`` seeds and p below ``SIGNIFICANCE``."""
    why = []
    if reached < seeds:
        why.append(f"{reached} of {seeds} seeds reached")
    if seeds < CLAIM_SEEDS:
        why.append(f"{seeds} seed{'s' if seeds != 1 else ''} (a claim needs {CLAIM_SEEDS})")
    elif p is None:
        why.append("no p-value")
    elif p >= SIGNIFICANCE:
        why.append(f"p = {p:.2g}")
    return "; ".join(why) or None


def standings(rows: list[dict[str, Any]], device: str, targets: Sequence[float] = TARGETS) -> list[dict[str, Any]]:
    """The speedrun's standings on one device (rows of other devices are ignored), per target, by the
    stored candidate name.

    Per candidate: seeds that reached the target of seeds run; mean time to target (s; :func:`stop_of`)
    with its min–max; mean tokens and steps to target; the p-value (:func:`p_value` over the seeds'
    whole-split losses at their stop where every seed has one, else over the sampled estimates, and
    which of the two); the mean loss at the stop, sampled and on the whole split, where every seed
    reached the target, else the mean loss where the seeds stopped or ended. A time is claimed (``rank``,
    and a speed-up over nanoGPT's claimed time) only where every seed reached the target, at least
    ``CLAIM_SEEDS`` seeds ran and p < ``SIGNIFICANCE``; the claimed come first, fastest first, the rest
    follow with ``not claimed`` saying why. Only runs aimed at or below a target count for it (:func:`aims_at`).
    """
    mine = on_device(rows, device)
    out = []
    for target in targets:
        stops = seed_stops(mine, target)
        if stops.empty:
            continue
        g = stops.groupby("candidate", sort=False)
        board = pd.DataFrame({
            "model": g["model"].first(), "seeds": g.size(), "reached": g["reached"].sum(),
            "time": g["time_s"].agg(_every), "time min": g["time_s"].min(), "time max": g["time_s"].max(),
            "tokens": g["tokens"].agg(_every), "steps": g["step"].agg(_every),
            "p sampled": g["val_loss"].agg(p_value, target=target),
            "p full": g["full_val_loss"].agg(_p_every, target=target),
            "val": g["val_loss"].mean(), "full": g["full_val_loss"].agg(_every)})
        # The sampled loss at the stop is below the target by construction (the run stops at the first
        # evaluation at or below it), so a test on it leans towards passing; the whole-split loss at the
        # same step was not used to stop, so where every seed has it, the test is made on it.
        board["p from"] = board["p full"].notna().map({True: "whole split", False: "sampled estimate"})
        board["p"] = board["p full"].where(board["p full"].notna(), board["p sampled"])
        board["all"] = board["reached"] == board["seeds"]
        board["why"] = [_why_not(int(b["seeds"]), int(b["reached"]), _num(b["p"])) for _, b in board.iterrows()]
        board["claimed"] = board["why"].isna()
        board = board.sort_values(["claimed", "all", "time", "reached"], ascending=[False, False, True, False],
                                  na_position="last")
        ref = board.loc[board["model"] == REFERENCE]
        t_ref = _num(ref["time"].iloc[0]) if len(ref) and ref["claimed"].iloc[0] else None
        rank = 0
        for name, b in board.iterrows():
            claimed, every = bool(b["claimed"]), bool(b["all"])
            rank += claimed
            t = _num(b["time"]) if every else None
            out.append({
                "device": device, "target": target, "rank": rank if claimed else None, "candidate": name,
                "model": b["model"], "seeds reached": f"{int(b['reached'])}/{int(b['seeds'])}",
                "seeds": int(b["seeds"]), DID_NOT_REACH: int(b["seeds"] - b["reached"]),
                "time to target s (mean)": t,
                "time to target s (min–max)": f"{b['time min']:.2f}–{b['time max']:.2f}" if t is not None else None,
                "speed-up vs nanoGPT": (t_ref / t) if (claimed and t and t_ref) else None,
                "tokens to target (mean)": _num(b["tokens"]) if every else None,
                "steps to target (mean)": _num(b["steps"]) if every else None,
                "p-value": _num(b["p"]), "p-value from": b["p from"] if _num(b["p"]) is not None else None,
                SIGNIFICANT: None if _num(b["p"]) is None else bool(b["p"] < SIGNIFICANCE),
                STOP_LOSS: _num(b["val"]) if every else None,
                "full-split loss at stop (mean)": _num(b["full"]) if every else None,
                ENDED_LOSS: None if every else _num(b["val"]),
                NOT_CLAIMED: b["why"],
            })
    return out


@table_view
def leaderboard(rows: list[dict[str, Any]], device: str, targets: Sequence[float] = TARGETS,
                ids: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """:func:`standings` as the chapter shows them: each candidate by its short id
    (:func:`ftlib.views.candidates.short_ids` of ``rows`` unless ``ids`` is given), the target to four
    decimals, the stored name and the bookkeeping columns left out."""
    ids = short_ids(rows) if ids is None else ids
    hidden = {"candidate", "model", "seeds", DID_NOT_REACH, SIGNIFICANT}
    return [{"device": x["device"], "target": f"{x['target']:.4f}", "rank": x["rank"],
             "id": id_of(ids, x["candidate"]),
             **{k: v for k, v in x.items() if k not in hidden and k not in ("device", "target", "rank")}}
            for x in standings(rows, device, targets)]


def leader(rows: list[dict[str, Any]], device: str, target: float = TARGET_LOSS) -> str | None:
    """The stored name of the fastest candidate other than the reference with a claimed time to ``target``
    on ``device`` (:func:`standings`), else None."""
    return next((x["model"] for x in standings(rows, device, (target,))
                 if x["rank"] is not None and x["candidate"] != REFERENCE), None)


def claims(rows: list[dict[str, Any]], device: str, target: float) -> bool:
    """Whether any candidate has a claimed time to ``target`` on ``device``."""
    return any(x["rank"] is not None for x in standings(rows, device, (target,)))


LEADERBOARD_PREVIEW = ("target", "rank", "id", "seeds reached", "time to target s (mean)",
                       "speed-up vs nanoGPT", "p-value", STOP_LOSS, ENDED_LOSS, NOT_CLAIMED)


def _until(curve: dict[str, Any], target: float) -> dict[str, Any]:
    """A curve up to its first evaluation at or below ``target``: a run aimed at a lower loss trains
    on past it (and may overfit), which is not part of the race to this target."""
    hit = next((i for i, v in enumerate(curve["val_loss"]) if v <= target), None)
    if hit is None:
        return curve
    return {**curve, **{k: curve[k][:hit + 1] for k in ("time_s", "tokens", "val_loss")}}


def leaderboard_figure(rows: list[dict[str, Any]], device: str, target: float = TARGET_LOSS, top: int = 5,
                       ids: Mapping[str, str] | None = None) -> go.Figure:
    """Validation loss against training time (startup excluded, a log axis: a speed-up is the same shift
    anywhere on it) and against tokens, one colour per candidate and one line per seed: nanoGPT's recipe
    and the ``top`` ranked candidates of the leaderboard for ``target``, labelled by their rank and short id
    (``ids``, as in :func:`leaderboard`), the legend in rank order, the leader drawn last, on top."""
    ids = short_ids(rows) if ids is None else ids
    board = [b for b in standings(rows, device, (target,)) if b["rank"] is not None]
    shown = [b for b in board if b["candidate"] == REFERENCE] + [b for b in board if b["candidate"] != REFERENCE][:top]
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=("against training time (log scale)",
                                        "against tokens trained on"))
    mine = one_run_per_seed(on_device(rows, device), target)
    top_y, times = 2.4, []
    colors = {b["candidate"]: "#7f7f7f" if b["candidate"] == REFERENCE else PALETTE[i % len(PALETTE)]
              for i, b in enumerate(shown)}
    # The reference first, then the candidates slowest first: the leader is drawn last, on top.
    for b in shown[:1 if shown and shown[0]["candidate"] == REFERENCE else 0] + sorted(
            (b for b in shown if b["candidate"] != REFERENCE), key=lambda b: -b["rank"]):
        ref = b["candidate"] == REFERENCE
        label = (f"#{b['rank']} {id_of(ids, b['candidate'])}" + (" (reference)" if ref else "")
                 + f", {b['time to target s (mean)']:.2f} s")
        curves = [_until(c, target) for c in speedrun_curves(mine, [b["candidate"]])]
        for j, c in enumerate(curves):
            # Where the curve enters the frame (the first evaluation below its top) to where it ends.
            times += [t for t, v in zip(c["time_s"], c["val_loss"]) if t > 0 and v <= top_y][:1] + c["time_s"][-1:]
            for col, x in ((1, c["time_s"]), (2, c["tokens"])):
                fig.add_trace(go.Scatter(x=x, y=c["val_loss"], mode="lines", name=label, legendgroup=label,
                                         legendrank=b["rank"], showlegend=col == 1 and j == 0,
                                         line=dict(color=colors[b["candidate"]], width=1.5,
                                                   dash="dot" if ref else "solid"),
                                         hovertemplate=f"seed {c['seed']}: %{{y:.3f}}<extra>{label}</extra>"),
                              row=1, col=col)
    fig.add_hline(y=target, line_dash="dash", line_color="#444", row="all", col="all")
    times = [t for t in times if t > 0]
    span = {}
    if times:
        lo, hi = min(times) / 1.2, max(times) * 1.2
        ticks = [m * 10 ** e for e in range(-2, 4) for m in (1, 2, 5) if lo <= m * 10 ** e <= hi]
        span = dict(range=[math.log10(lo), math.log10(hi)], tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])
    fig.update_xaxes(title_text="training time excluding startup (s)", type="log", row=1, col=1, **span)
    fig.update_xaxes(title_text="tokens", row=1, col=2)
    fig.update_yaxes(title_text="validation loss (sampled)", range=[target - 0.1, top_y], row=1, col=1)
    fig.update_layout(title=f"Speedrun to {target:.4f}, {gpu_label(device)}: the claimed candidates by rank",
                      height=480)
    return legend_below(fig)


def _entry(b: dict[str, Any]) -> str:
    p = b["p-value"]
    sig = ("no p-value" if p is None else
           f"p = {p:.2g}, {'below' if p < SIGNIFICANCE else 'not below'} {SIGNIFICANCE:g}")
    full = b["full-split loss at stop (mean)"]
    return (f"{b['time to target s (mean)']:.2f} s ({b['time to target s (min–max)']} s) over {b['seeds reached']} "
            f"seeds, {b['steps to target (mean)']:.0f} steps, {b['tokens to target (mean)'] / 1e6:.1f} M tokens, "
            f"{sig}; loss at the stop {b[STOP_LOSS]:.4f} sampled, "
            + ("not recorded on the whole split" if full is None else f"{full:.4f} on the whole split"))


def findings(rows: list[dict[str, Any]], device: str, targets: Sequence[float] = TARGETS,
             ids: Mapping[str, str] | None = None) -> str:
    """'What we found' on one device, computed from the standings: per target, how many candidates ran
    and how many have a claimed time, nanoGPT's recipe, and the fastest claimed candidate (by its short
    id, ``ids`` as in :func:`leaderboard`, and its model and recipe in words)."""
    mine = on_device(rows, device)
    if not mine:
        return f"{gpu_label(device)}: no speedrun rows stored for this device."
    ids = short_ids(rows) if ids is None else ids
    board = standings(mine, device, targets)
    own = sorted({r["target"] for r in mine if r.get("target") is not None})
    first = {r["model"]: r for r in sorted(mine, key=lambda r: r.get("seed", 0), reverse=True) if r.get("config")}
    lines = []
    for target in targets:
        b = [x for x in board if x["target"] == target]
        if not b:
            lines.append(f"{gpu_label(device)}, target {target:.4f}: no run aimed at it (these runs stop at the "
                         f"first evaluation at or below {', '.join(f'{t:.4f}' for t in own) or 'their target'}).")
            continue
        claimed = [x for x in b if x["rank"] is not None]
        lines.append(f"{gpu_label(device)}, target {target:.4f}: {len(b)} candidates ran, {len(claimed)} with a "
                     f"claimed time (every seed reached, at least {CLAIM_SEEDS} seeds, {SIGNIFICANT}).")
        ref = next((x for x in b if x["candidate"] == REFERENCE), None)
        lines.append("  nanoGPT's recipe: " + (_entry(ref) if ref and ref["rank"] is not None else
                                               f"no claimed time ({ref[NOT_CLAIMED] if ref else 'not run'})") + ".")
        x = next((x for x in claimed if x["candidate"] != REFERENCE), None)
        if x is None:
            lines.append("  No other candidate has a claimed time.")
            continue
        up = x["speed-up vs nanoGPT"]
        lines += [f"  Fastest claimed, #{x['rank']} {id_of(ids, x['candidate'])}: " + _entry(x)
                  + (f"; {up:.2f}x nanoGPT's recipe." if up else "; no speed-up without nanoGPT's claimed time."),
                  f"    {id_of(ids, x['candidate'])}: {in_words(first[x['model']])}"]
    return "\n".join(lines)
