"""Tables: HTML that renders (not a pipe paragraph), deterministic, formatted by unit, long ones collapsed."""

from __future__ import annotations

import base64
import re

import pandas as pd
import pytest

from ftlib.views import tables


def rows(n: int = 3) -> list[dict]:
    return [{"device": "h200", "mode": f"m{i}", "gpt2 ms": 10.0 + i, "speed-up": 1.4456, "of ceiling": 0.873,
             "params": 4837888, "check ok": i % 2 == 0, "note": None} for i in range(n)]


def test_html_table_deterministic_and_formatted_by_unit():
    a, b = tables.table_bundle(rows()), tables.table_bundle(rows())
    assert a == b, "same rows, same HTML (nbval compares it)"
    html = a["text/html"]
    assert "<table" in html and 'class="dataframe ftlib-table"' in html
    assert re.search(r'id="T_ft[0-9a-f]{10}"', html)
    for cell in (">10<", ">1.45×<", ">87%<", ">4,837,888<", ">yes<", ">no<", ">–<"):
        assert cell in html, cell
    # another table, another id
    other = tables.table_bundle(rows(2))["text/html"]
    assert re.search(r'id="(T_ft[0-9a-f]+)"', other).group(1) != re.search(r'id="(T_ft[0-9a-f]+)"', html).group(1)
    # the plain-text twin is a pipe table with the same cells, its header naming the model as the book does
    plain = a["text/plain"].splitlines()
    assert plain[0].startswith("| device | mode | GPT-2 ms |") and plain[1].startswith("|---|")
    assert "1.45×" in plain[2] and "–" in plain[2]


@pytest.mark.parametrize("column, value, shown", [
    ("speed-up", 1.5, "1.50×"), ("engine over compile-ro", 2.05, "2.05×"), ("gpt2 / FT", 3.53, "3.53×"),
    ("largest share", 0.4, "40%"), ("efficiency", 0.005, "0.5%"), ("tokens/s", 1234567.8, "1,234,568"),
    ("GFLOP / step", 145.9, "146"), ("K/V heads", 8, "8"), ("FT (original (B,1,T,d) K/V) ms", 20.1, "20.1"),
    ("T", 4096, "4096"), ("steps", 4096, "4,096"), ("x", float("nan"), "–"), ("x", None, "–"), ("x", "text", "text"),
    ("engine ms", 2.998, "3.00"), ("its ms", 0.09996, "0.100"), ("GFLOP", 99.96, "100"), ("lr", 6e-4, "0.0006"),
    ("dropout", 0.5, "0.5"), ("ms", 32.0, "32"), ("x", 1.23456e-5, "1.23e-05"),
])
def test_cells_by_unit(column, value, shown):
    assert tables.fmt(value, 3, column) == shown


def test_numbers_in_a_mixed_column_are_right_aligned():
    html = tables.table_bundle([{"per step": "backend", "GPT-2": "explicit"}, {"per step": "GFLOP", "GPT-2": 274.8}])
    cell = re.search(r'<td id="(T_ft[0-9a-f]+_row1_col1)"[^>]*>275<', html["text/html"])
    assert cell and re.search(cell.group(1) + r" \{\s*text-align: right;", html["text/html"])


def test_long_table_previews_and_collapses_with_a_csv():
    html = tables.table_bundle(rows(40), name="runs")["text/html"]
    assert html.count("<table") == 2 and "<details" in html and "All 40 rows and 8 columns" in html
    preview, full = html.split("<details")
    assert preview.count("<tr>") == 1 + tables.PREVIEW_ROWS and full.count("<tr>") == 1 + 40
    csv = re.search(r'href="data:text/csv;charset=utf-8;base64,([^"]+)"', html).group(1)
    frame = pd.read_csv(pd.io.common.StringIO(base64.b64decode(csv).decode()))
    assert len(frame) == 40 and frame["gpt2 ms"].iloc[3] == 13.0  # raw values and headers, not formatted ones
    assert 'download="runs.csv"' in html
    preview = tables.table_bundle(rows(40), head=3)["text/html"].split("<details")[0]
    assert preview.count("<tr>") == 1 + 3 and "the first 3 of 40 rows" in preview  # a chosen preview length


def test_a_collapsed_table_has_no_preview_only_its_whole_folded():
    """collapsed: the whole table under a <details> whose summary is the caption, even a short one."""
    html = tables.table_bundle(rows(40), caption="Every variant", collapsed=True)["text/html"]
    assert html.startswith("<details") and html.count("<table") == 1 and html.count("<tr>") == 1 + 40
    assert "<summary>Every variant: all 40 rows and 8 columns</summary>" in html
    assert tables.table_bundle(rows(2), collapsed=True)["text/html"].startswith("<details")


def test_wide_table_shows_chosen_columns_then_all():
    wide = [{**r, **{f"extra {j}": j for j in range(4)}} for r in rows(6)]
    html = tables.table_bundle(wide, preview=["mode", "speed-up"])["text/html"]
    preview = html.split("<details")[0]
    assert "speed-up" in preview and "gpt2 ms" not in preview and "2 of 12 columns" in preview
    assert "extra 3" in html.split("<details")[1]


def test_wide_table_of_few_rows_is_transposed():
    html = tables.table_bundle(rows(2))["text/html"]  # 8 columns: as is
    assert ">GPT-2 ms<" in html.split("<tbody>")[0]
    wide = [{**r, "extra": 1} for r in rows(2)]  # 9 columns, 2 rows: one line per column
    html = tables.table_bundle(wide)["text/html"]
    head, body = html.split("<tbody>")
    assert "H200 · m0" in head and "H200 · m1" in head and ">GPT-2 ms<" in body
    # as few leading columns as tell the lines apart: here the first alone
    unique = [{**r, "device": f"dev{i}"} for i, r in enumerate(wide)]
    head = tables.table_bundle(unique)["text/html"].split("<tbody>")[0]
    assert ">dev0<" in head and ">device<" in head and "·" not in head


def test_an_empty_table_says_so():
    assert tables.table_bundle([], caption="on h200") == {"text/html": "<p><em>on h200: no rows</em></p>",
                                                         "text/plain": "(on h200: no rows)"}


def test_show_table_keeps_its_signature(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.instance()
    tables.show_table(rows(), ["mode", "gpt2 ms"], 2)
    tables.show_frame(tables.to_frame(rows(), ["mode", "gpt2 ms"]))
    assert tables.md_table(rows(1), ["mode", "gpt2 ms"]).splitlines()[2] == "| m0 | 10 |"


def test_decimals_give_every_plain_number_the_same_places():
    got = tables.table_bundle([{"what": "a", "GFLOP": 4.3, "speed-up": 1.5}, {"what": "sum", "GFLOP": 15.0324}],
                              decimals=2)["text/plain"]
    assert "4.30" in got and "15.03" in got and "1.50×" in got
    assert "| 4.3 |" in tables.table_bundle([{"what": "a", "GFLOP": 4.3}])["text/plain"]  # figures by default


def test_to_frame_keeps_types_for_grouping():
    frame = tables.to_frame(rows(4) + [{"device": "cpu", "mode": "m9", "params": None}])
    assert str(frame["params"].dtype) == "Int64" and frame["params"].isna().sum() == 1
    assert frame.groupby("device")["gpt2 ms"].count().to_dict() == {"cpu": 0, "h200": 4}


def test_group_rows_never_pools_devices():
    rs = [{"device_slug": "h200", "model": "gpt2"}, {"device_slug": "cpu", "model": "gpt2"},
          {"device_slug": "h200", "model": "gpt2"}, {"model": "gpt2"}]
    g = tables.group_rows(rs)
    assert list(g) == ["h200", "cpu", None] and len(g["h200"]) == 2
    assert list(tables.group_rows(rs, "device_slug", "model")) == [("h200", "gpt2"), ("cpu", "gpt2"), (None, "gpt2")]


def test_a_column_of_long_texts_keeps_a_width():
    why = ["compile-ro with the whole step compiled (fused AdamW)", "x"]
    cells = pd.DataFrame({"device": ["h200", "t4"], "why": why, "ms": ["1.5", "2.0"]})
    nums = pd.DataFrame({"device": [False, False], "why": [False, False], "ms": [True, True]})
    out = tables.styled(cells, nums, "ftabc")
    widths = dict(re.findall(r"#T_ftabc td\.col(\d) \{\s*min-width: (\d+)em;", out))
    assert widths == {"1": "22"}  # the long text column only: half its longest text, capped at 22em


def test_a_device_column_names_the_gpu_not_its_results_folder():
    """A reader sees 'H100 80GB HBM3' where the rows hold the folder 'h100-80gb-hbm3'; a name that is not a
    known folder (the post's 'Tesla T4', a CPU) stays as written, and a reader's own rows keep their tag."""
    assert tables.fmt("h100-80gb-hbm3", column="device") == "H100 80GB HBM3"
    assert tables.fmt("h200 (this run)", column="device") == "H200 (this run)"
    assert tables.fmt("Tesla T4", column="device") == "Tesla T4"
    assert tables.fmt("cpu", column="device") == "cpu"
    assert tables.fmt("h200", column="model") == "h200"  # only the device column
    text = tables.table_bundle([{"device": "h200", "ms": 1.0}])["text/plain"]
    assert "| H200 | 1.00 |" in text or "| H200 | 1 |" in text


def test_a_model_column_names_the_model_not_its_preset_key():
    """A reader sees 'GPT-2 + MQA' where the rows hold 'gpt2 + MQA'; a name that only starts with the letters
    of a key, or a candidate's own name, stays as written, and so does any other column."""
    assert tables.fmt("gpt2 + MQA", column="model") == "GPT-2 + MQA"
    assert tables.fmt("fasttransformer", column="model") == "FastTransformer"
    assert tables.fmt("nanogpt-char (reference)", column="model") == "nanoGPT shakespeare_char (reference)"
    assert tables.fmt("gpt2x", column="model") == "gpt2x"
    assert tables.fmt("256x6 FT-style", column="model") == "256x6 FT-style"
    assert tables.fmt("gpt2", column="label") == "gpt2"
    assert tables.fmt("+no bias = fasttransformer", column="rung") == "+no bias = FastTransformer"  # the ladder's
    assert tables.fmt("gpt2 fuse_mlp_act=True", column="case") == "GPT-2 fuse_mlp_act=True"  # an engine case
    assert tables.fmt("gpt2", column="cell") == "GPT-2"  # the co-design grid's cell without a change
    assert tables.fmt("fasttransformer", column="engine") == "FastTransformer"  # the engine an option extends
    assert "| GPT-2 + MQA |" in tables.table_bundle([{"model": "gpt2 + MQA", "ms": 1.0}])["text/plain"]
