"""Showing plotly figures in the book so they work everywhere and stay testable.

``show(fig, name)`` emits one output with three representations:

* ``application/vnd.plotly.v1+json`` - rendered interactively by JupyterLab;
* ``text/html`` - a self-contained div (plotly.js from its CDN) for Colab, HTML builds
  and nbviewer; its div id is derived from ``name``, so the output is deterministic and
  nbval can compare it;
* ``image/png`` - a static image when kaleido can render one (GitHub, no-JS viewers);
* ``text/plain`` - the figure's title, for terminals.
"""

from __future__ import annotations

import json
import math
import os
import re
import textwrap
import warnings
from collections.abc import Iterable

import plotly.graph_objects as go

TEMPLATE = "plotly_white"
# Colours for the book's two models, the same in every chapter.
MODEL_COLORS = {"gpt2": "#d62728", "fasttransformer": "#1f77b4", "fasttransformer-broadcast": "#17becf",
                "nanogpt-char": "#7f7f7f"}
# Distinct colours for up to 20 series (Tableau 20's dark and light pairs, darks first).
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7",
           "#dbdb8d", "#9edae5"]


SUBTITLE_CHARS = 125  # characters of a subtitle line (plotly's <sup> size) that fit the static image's width
# A subtitle line's height in the static image: plotly spaces <sup> lines about 22 px apart at the title's size.
SUBTITLE_LINE_PX = 22
TITLE_TOP_PX = 30  # from the image's top edge to the title's top


def with_subtitle(fig: go.Figure, title: str, note: str) -> go.Figure:
    """``title`` with ``note`` under it in small type, wrapped to lines that fit the static image (so that a long
    note does not run off its right edge), the top margin grown by the lines beyond the first. The title hangs
    from the image's top edge: plotly's default centres it in the margin, which would carry a long note down onto
    the subplots' titles."""
    lines = textwrap.wrap(note, SUBTITLE_CHARS) if note else []
    text = title + ("<br><sup>" + "<br>".join(lines) + "</sup>" if lines else "")
    fig.update_layout(title=dict(text=text, yref="container", y=1, yanchor="top", pad_t=TITLE_TOP_PX),
                      margin_t=100 + SUBTITLE_LINE_PX * max(0, len(lines) - 1))
    return fig


def legend_below(fig: go.Figure) -> go.Figure:
    """A horizontal legend under the plot (for long or many series names), leaving the full width to the data."""
    fig.update_layout(legend=dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0, xanchor="left"),
                      margin_b=max(fig.layout.margin.b or 0, 40))
    return fig


# A horizontal legend entry's width in the static image (900 px wide, plotly's 12 px font): the line sample and
# its gap, then each character of the name. The legend wraps at the plot area's width: the image's less plotly's
# default margins of 80 px left and right.
LEGEND_ENTRY_PX, LEGEND_CHAR_PX, STATIC_WIDTH, MARGIN_PX = 46, 6.6, 900, 80


def legend_rows(names: Iterable[str], width: int = STATIC_WIDTH - 2 * MARGIN_PX) -> int:
    """How many rows a horizontal legend of ``names`` fills, its entries packed left to right as plotly packs
    them, for a figure that grows with its legend: an estimate from the names' lengths, generous rather than
    short, so that the last row is not cut off."""
    rows, used = 0, width
    for name in names:
        w = LEGEND_ENTRY_PX + LEGEND_CHAR_PX * len(name)
        if used + w > width:
            rows, used = rows + 1, 0
        used += w
    return rows


def log_ticks(values: Iterable[float]) -> dict:
    """Axis settings that label a log axis at the data's own values (e.g. T = 128 ... 4096), not at 2, 5, 10."""
    vals = sorted({v for v in values if v})
    return dict(type="log", tickvals=vals, ticktext=[f"{v:g}" for v in vals])


def log_axis(values: Iterable[float | None]) -> dict:
    """A log axis labelled at 1, 2, 5 x 10^k over the span of ``values`` (plain numbers, no minor-digit clutter);
    where fewer than three of those fall inside the span (values within a factor of five or so), at 1, 2, 3,
    5 x 10^k, and where fewer than two even then, at every 1..9 x 10^k, so that a narrow span still reads
    off two labels or more and a span of a few times off three."""
    vals = [v for v in values if v is not None and v > 0]
    if not vals:
        return dict(type="log")
    lo, hi = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))

    def ticks(mantissas: tuple[int, ...]) -> list[float]:
        return [m * 10.0**k for k in range(lo, hi + 1) for m in mantissas
                if min(vals) / 2 <= m * 10.0**k <= max(vals) * 2]

    def inside(ts: list[float]) -> int:
        return sum(min(vals) <= t <= max(vals) for t in ts)

    picked = ticks((1, 2, 5))
    if inside(picked) < 3:
        picked = ticks((1, 2, 3, 5))
    if inside(picked) < 2:
        picked = ticks(tuple(range(1, 10)))
    return dict(type="log", tickvals=picked, ticktext=[f"{t:g}" for t in picked])


def _slug(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_-]+", "-", name).strip("-") or "figure"


_KALEIDO: dict[str, bool] = {}


def _kaleido_ready() -> bool:
    """Start kaleido's browser once per process (2 s), so each later image takes ~0.2 s.

    False, and not tried again, where kaleido or a Chromium/Chrome is missing, or where
    ``FTLIB_STATIC_PNG=0`` turns static images off.
    """
    if "ok" not in _KALEIDO:
        ok = os.environ.get("FTLIB_STATIC_PNG", "1") != "0"
        if ok:
            try:
                import kaleido

                kaleido.start_sync_server(silence_warnings=True)
            except Exception:  # no kaleido, no browser: interactive outputs still work
                ok = False
        _KALEIDO["ok"] = ok
    return _KALEIDO["ok"]


def static_png(fig: go.Figure) -> bytes | None:
    """PNG bytes via kaleido, or None where kaleido/Chromium is not available."""
    if not _kaleido_ready():
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "kopts is ignored if using a server"
            return fig.to_image(format="png", width=STATIC_WIDTH, height=fig.layout.height or 450, scale=1)
    except Exception:
        return None


def bundle(fig: go.Figure, name: str, png: bool = True) -> dict:
    """The mime bundle :func:`show` displays."""
    fig.update_layout(template=TEMPLATE)
    # The plain-text title without its markup, for a terminal and the figure list: "title — subtitle".
    title = re.sub(r"\s*<br>\s*<sup>\s*", " — ", fig.layout.title.text or name, count=1)
    title = " ".join(re.sub(r"<[^>]+>", " ", title).split())
    data = {
        "application/vnd.plotly.v1+json": json.loads(fig.to_json()),
        "text/html": fig.to_html(include_plotlyjs="cdn", full_html=False, div_id=f"fig-{_slug(name)}"),
        "text/plain": f"<Figure: {title}>",
    }
    if png:
        img = static_png(fig)
        if img is not None:
            import base64

            data["image/png"] = base64.b64encode(img).decode()
    return data


def show(fig: go.Figure, name: str, png: bool = True) -> None:
    """Display ``fig`` with interactive and static representations (see module docstring)."""
    from IPython.display import display

    display(bundle(fig, name, png), raw=True)
