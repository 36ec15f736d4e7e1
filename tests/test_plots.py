"""Figures: every representation present, the interactive ones deterministic."""

import base64

import plotly.graph_objects as go
import pytest

from ftlib.views import plots


def fig():
    return go.Figure(go.Bar(x=["a", "b"], y=[1.5, 2.0]), layout=dict(title="t"))


def test_bundle_is_deterministic_and_complete(monkeypatch):
    monkeypatch.setenv("FTLIB_STATIC_PNG", "0")
    monkeypatch.setattr(plots, "_KALEIDO", {})
    a, b = plots.bundle(fig(), "my fig"), plots.bundle(fig(), "my fig")
    assert a == b and "image/png" not in a
    assert 'id="fig-my-fig"' in a["text/html"] and a["text/plain"] == "<Figure: t>"
    assert a["application/vnd.plotly.v1+json"]["data"][0]["y"] == [1.5, 2.0]
    sub = plots.with_subtitle(fig(), "t", "a note " * 40)  # a long note: wrapped, and plain in the text output
    assert sub.layout.title.text.count("<br>") >= 2 and sub.layout.margin.t > 100
    lines = sub.layout.title.text.replace("<sup>", "").replace("</sup>", "").split("<br>")[1:]
    assert all(len(line) <= plots.SUBTITLE_CHARS for line in lines)
    assert plots.bundle(sub, "x")["text/plain"] == "<Figure: t — " + " ".join(["a note"] * 40) + ">"
    # The title hangs from the image's top, and the margin grows by a whole line per line beyond the first, so
    # that a long note stays above the subplots' titles (plotly's default centres the title in the margin).
    assert (sub.layout.title.yref, sub.layout.title.y, sub.layout.title.yanchor) == ("container", 1, "top")
    assert sub.layout.margin.t == 100 + plots.SUBTITLE_LINE_PX * (len(lines) - 1) and plots.SUBTITLE_LINE_PX >= 20


def test_static_png_when_a_browser_is_there(monkeypatch):
    monkeypatch.setattr(plots, "_KALEIDO", {})
    monkeypatch.delenv("FTLIB_STATIC_PNG", raising=False)
    pytest.importorskip("kaleido")
    png = plots.static_png(fig())
    if png is None:
        pytest.skip("kaleido found no Chromium/Chrome here")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert base64.b64decode(plots.bundle(fig(), "x")["image/png"])[:4] == b"\x89PNG"


def test_a_log_axis_labels_a_narrow_span_at_least_twice():
    from ftlib.views.plots import log_axis

    wide = log_axis([3.0, 400.0])
    assert wide["tickvals"] == [2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0]  # 1, 2, 5 x 10^k
    narrow = log_axis([50.0, 62.8, 69.9])  # one 1-2-5 label (50) inside the span: every 1..9 x 10^k instead
    inside = [t for t in narrow["tickvals"] if 50.0 <= t <= 69.9]
    assert inside == [50.0, 60.0] and narrow["ticktext"][narrow["tickvals"].index(60.0)] == "60"
    few = log_axis([22.0, 35.0, 100.0])  # two 1-2-5 labels inside (50, 100): 30 joins them
    assert [t for t in few["tickvals"] if 22.0 <= t <= 100.0] == [30.0, 50.0, 100.0]


def test_legend_rows_pack_names_by_their_length():
    assert plots.legend_rows([]) == 0
    assert plots.legend_rows(["gpt2", "fasttransformer", "gpt2 +flash-attn"]) == 1  # short names share a row
    long = "fasttransformer fuse_head_loss=True relaxed_atomics=True"  # about 420 px: two to a 900 px row
    assert plots.legend_rows([long] * 4, width=900) == 2
    assert plots.legend_rows([long] * 4, width=600) == 4
    # by default the width the legend wraps at: the static image's less plotly's margins (80 px each side)
    assert plots.legend_rows(["x" * 50] * 4) == plots.legend_rows(["x" * 50] * 4, width=740) == 4
    assert plots.legend_rows(["x" * 200]) == 1  # a name wider than the figure still takes one row
