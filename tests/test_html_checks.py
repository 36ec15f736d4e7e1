"""The rules of the HTML site's browser check (ci/test-html.py), without a browser: absurd axes,
broken internal links and the tables a notebook holds."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def th():
    spec = importlib.util.spec_from_file_location("test_html_tool", ROOT / "ci" / "test-html.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def axis(name="xaxis", type="linear", range=(0, 10), lo=0.0, hi=10.0):
    return {"name": name, "type": type, "range": list(range), "min": lo, "max": hi}


def test_sane_axes_pass(th):
    assert th.axis_problems([axis(), axis("yaxis", "log", (-1.3, 2.4), 0.05, 250.0),
                             axis("xaxis2", "category", (-0.5, 3.5), None, None)]) == []


def test_a_log_axis_over_twelve_decades_fails(th):
    # the shape of a vertical line's annotation placed at x = 103 on a log axis: 10^103
    probs = th.axis_problems([axis("xaxis", "log", (-1.0, 150.0), 0.1, 100.0)])
    assert len(probs) == 1 and "151 decades" in probs[0]


def test_a_linear_axis_far_wider_than_its_data_fails(th):
    assert th.axis_problems([axis(range=(0, 1e6), lo=1.0, hi=20.0)])
    assert not th.axis_problems([axis(range=(0, 25), lo=1.0, hi=20.0)])
    # data of one value: its magnitude is the scale
    assert not th.axis_problems([axis(range=(4, 6), lo=5.0, hi=5.0)])
    assert th.axis_problems([axis(range=(0, 1e5), lo=5.0, hi=5.0)])


def test_links_into_the_site_must_resolve(th, tmp_path):
    (tmp_path / "a.html").write_text('<h1 id="top">A</h1><section id="part-2"></section>')
    (tmp_path / "_static").mkdir()
    (tmp_path / "_static" / "x.js").write_text("")
    base = "http://127.0.0.1:8000/"
    ok = ["a.html", "a.html#part-2", "#top", "_static/x.js", "https://example.org/", "mailto:x@y", "data:text/csv,1",
          "", "a.html#"]
    assert th.link_problems(tmp_path, "a.html", ok, base) == []
    bad = th.link_problems(tmp_path, "a.html", ["b.html", "a.html#nowhere", "#missing", "_static/y.png"], base)
    assert len(bad) == 4 and all(p.startswith("broken link") for p in bad)


def test_expected_tables_counts_html_tables_in_outputs(th, tmp_path):
    nb = {"cells": [
        {"cell_type": "code", "metadata": {}, "outputs": [
            {"output_type": "display_data", "data": {"text/html": ["<table id='a'>", "</table>"], "text/plain": "|a|"}},
            {"output_type": "display_data", "data": {"text/html": "<table></table><details><table></table></details>"}},
            {"output_type": "display_data", "data": {"text/markdown": "| a |\n|---|\n| 1 |"}}]},
        {"cell_type": "code", "metadata": {"tags": ["remove-cell"]}, "outputs": [
            {"output_type": "display_data", "data": {"text/html": "<table></table>"}}]},
    ]}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    assert th.expected_tables(path) == 3
