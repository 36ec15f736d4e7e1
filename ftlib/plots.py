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
import os
import re
import warnings

import plotly.graph_objects as go

TEMPLATE = "plotly_white"


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
            return fig.to_image(format="png", width=900, height=fig.layout.height or 450, scale=1)
    except Exception:
        return None


def bundle(fig: go.Figure, name: str, png: bool = True) -> dict:
    """The mime bundle :func:`show` displays."""
    fig.update_layout(template=TEMPLATE)
    title = fig.layout.title.text or name
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
