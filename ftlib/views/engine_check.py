"""The engine's 100-step check against reference training (rows of ``engine_check``) for chapter 6: one row
per (model, precision), the engine and the reference trained 100 steps side by side from the same weights on
the same batches (``losses_engine``, ``losses_ref``, ``max_rel_err``, ``ok``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ftlib.views.bench import gpu_label, model_title
from ftlib.views.engine import MODELS, latest_run
from ftlib.views.plots import MODEL_COLORS, PALETTE, legend_below, legend_rows, with_subtitle
from ftlib.views.tables import table_view

ERR_FLOOR = 1e-9  # the error panel's floor: a log axis has no 0, and an error of 0 is drawn here


@table_view
def loss_table(check_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per device, model, precision: the 100-step check's agreement (max relative loss error vs rtol),
    the newest run only."""
    out = []
    order = ("fp32", "tf32", "bf16")
    for r in sorted(latest_run(check_rows), key=lambda r: (
            r["device_slug"], order.index(r["precision"]) if r["precision"] in order else 9, r["label"])):
        ref = r.get("losses_ref") or []
        out.append({"device": r["device_slug"], "model": r["label"], "precision": r["precision"],
                    "steps": r.get("steps"), "ref loss first": ref[0] if ref else None,
                    "ref loss last": ref[-1] if ref else None, "max rel err": r.get("max_rel_err"),
                    "rtol": r.get("rtol"), "param rel err": r.get("param_rel_err"),
                    "ok": r.get("ok", r.get("check_ok")), "kernels": ", ".join(r.get("kernels") or []) or None})
    return out


def loss_figure(check_rows: Iterable[dict[str, Any]], device: str) -> go.Figure:
    """Per precision (columns): engine (solid) and reference (dotted) loss per step, and below it
    the relative difference |engine - reference| / reference per step on a log scale, drawn at
    :data:`ERR_FLOOR` where it is smaller (0 where both agree to the last bit).

    One colour per checked case, the same in every panel; the default engine of each model is drawn,
    the option variants are in the legend, drawn on a click. The largest relative error of each
    case is in :func:`loss_table`.
    """
    rows = [r for r in latest_run(check_rows) if r["device_slug"] == device and r.get("losses_engine")]
    precs = [p for p in ("fp32", "tf32", "bf16") if any(r["precision"] == p for r in rows)]
    labels = list(dict.fromkeys(r["label"] for r in sorted(rows, key=lambda r: (r["label"] not in MODELS, r["label"]))))
    others = [c for c in PALETTE if c not in MODEL_COLORS.values()]
    colors = {lab: MODEL_COLORS.get(lab) or others[i % len(others)] for i, lab in enumerate(labels)}
    n = max(1, len(precs))
    fig = make_subplots(rows=2, cols=n, subplot_titles=precs + [""] * n, shared_xaxes=True,
                        row_heights=[0.6, 0.4], vertical_spacing=0.08, horizontal_spacing=0.06)
    shown: set[str] = set()
    for i, p in enumerate(precs, start=1):
        decades = 0.0  # of the drawn relative errors: one tick a decade crowds a short panel beyond about five
        for r in (r for r in rows if r["precision"] == p):
            c, first, name = colors[r["label"]], r["label"] not in shown, model_title(r["label"])
            shown.add(r["label"])
            vis = True if r["label"] in MODELS else "legendonly"
            steps = list(range(1, len(r["losses_engine"]) + 1))
            fig.add_trace(go.Scatter(x=steps, y=r["losses_engine"], mode="lines", name=name,
                                     line=dict(color=c), legendgroup=r["label"], showlegend=first, visible=vis),
                          row=1, col=i)
            fig.add_trace(go.Scatter(x=steps, y=r["losses_ref"], mode="lines", name=f"{name} reference",
                                     line=dict(color=c, dash="dot"), legendgroup=r["label"], showlegend=False,
                                     visible=vis),
                          row=1, col=i)
            rel = [max(abs(e - f) / abs(f), ERR_FLOOR) if f else None
                   for e, f in zip(r["losses_engine"], r["losses_ref"])]
            if vis is True and (drawn := [v for v in rel if v is not None]):
                decades = max(decades, math.log10(max(drawn) / min(drawn)))
            fig.add_trace(go.Scatter(x=steps, y=rel, mode="lines", name=f"{name} |engine - ref| / ref",
                                     line=dict(color=c, width=1), legendgroup=r["label"], showlegend=False,
                                     visible=vis),
                          row=2, col=i)
        fig.update_xaxes(title_text="step", row=2, col=i)
        fig.update_yaxes(type="log", dtick=1 if decades <= 5 else 2, tickformat=".0e", row=2, col=i)
    for dash, what in (("solid", "engine"), ("dot", "reference (train_step + torch.optim.AdamW)")):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=what, line=dict(color="#555", dash=dash),
                                 legendgroup="style", legendgrouptitle_text="line"))
    fig.update_yaxes(title_text="training loss", row=1, col=1)
    fig.update_yaxes(title_text="|engine − ref| / ref<br>(floor 10⁻⁹: 0 drawn there)", row=2, col=1)
    # The legend below the panels holds every case and, under its title, the two line styles: the figure grows
    # with it (about 30 px a row), so that none is cut off.
    rows_of_legend = legend_rows(map(model_title, labels)) + 3
    variants = len([lab for lab in labels if lab not in MODELS])
    faded = "faded entry is an option variant" if variants == 1 else f"{variants} faded entries are option variants"
    sub = (f"the default engines drawn; the {faded}, drawn on a click in the interactive figure (every case's "
           "largest error is in the table)" if variants else "")
    fig.update_layout(height=420 + 30 * rows_of_legend)
    with_subtitle(fig, f"Engine vs reference training, {gpu_label(device)}: loss per step", sub)
    return legend_below(fig)


def _root_error(r: dict[str, Any]) -> str:
    """The first CUDA error the row's traceback names (the cause, where a later call only reports it), else the
    first line of its error."""
    for line in str(r.get("traceback") or "").splitlines():
        if "CUDA error:" in line:
            return line.split("CUDA error:", 1)[1].strip()
    return str(r.get("error") or "the losses disagreed").splitlines()[0]


def failures(check_rows: Iterable[dict[str, Any]]) -> str:
    """Markdown, one item per device whose newest run (its newest row's ``run_id``) has checks that did not pass:
    those that failed to run (status not 'ok') or whose losses disagreed, each with the error's cause and the
    commit of the newest earlier run where the same case passed. '' where every check of the newest runs passed."""
    rows = [r for r in check_rows if r.get("run_id")]
    out = []
    for dev in sorted({r["device_slug"] for r in rows}):
        mine = sorted((r for r in rows if r["device_slug"] == dev), key=lambda r: str(r.get("date")))
        run = mine[-1]["run_id"]
        newest = [r for r in mine if r["run_id"] == run]
        bad = [r for r in newest if r.get("status") != "ok" or not r.get("check_ok", r.get("ok"))]
        if not bad:
            continue
        items = []
        for r in bad:
            passed = [p for p in mine if p["run_id"] != run and (p["label"], p["precision"]) == (r["label"],
                      r["precision"]) and p.get("status") == "ok" and p.get("check_ok", p.get("ok"))]
            items.append(f"`{r['label']}` in {r['precision']}: {_root_error(r)}"
                         + (f" (it passed at commit {passed[-1].get('commit')})" if passed else ""))
        out.append(f"* On the {gpu_label(dev)}, {len(bad)} of the {len(newest)} checks of the newest run (commit "
                   f"{newest[0].get('commit')}) did not pass: " + "; ".join(items) + ".")
    return "\n".join(out)
