"""Tables for the book: rows of dicts shown as HTML tables (pandas Styler) with a plain-text twin.

``show_table(rows, columns, digits)`` displays one output with two representations:

* ``text/html`` - a pandas Styler table, rendered by JupyterLab, Colab and the HTML site;
  its element id is derived from the table's content (``Styler.set_uuid``), so the output is
  deterministic and nbval can compare it;
* ``text/plain`` - the same cells as a pipe table, for terminals and logs.

Cells are formatted by their column's unit, read off the column name: ratios (``speed-up``,
``x over y``, ``a / b``) as ``1.45×``, fractions of a whole (``of ceiling``, ``share``,
``efficiency``) as percentages, other numbers with ``digits`` significant figures and
thousands separators; a missing value is "–". A table with more than ``MAX_ROWS`` rows or
``MAX_COLUMNS`` columns shows a preview (its first rows, its first or chosen columns) and the
whole table collapsed under it (an HTML ``<details>``) with a CSV download of the raw values;
a wide table of a few rows is shown transposed instead, one line per column.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import math
import numbers
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd
from pandas.io.formats.style import Styler

from ftlib.views.bench import gpu_label, model_title

MISSING = "–"
MAX_ROWS = 25  # longer tables are previewed, the whole table collapsed under the preview
MAX_COLUMNS = 8  # wider tables likewise (or transposed when they have few rows)
PREVIEW_ROWS = 10
TRANSPOSE_ROWS = 4  # a wide table of at most this many rows reads better as one line per column

# Column names whose values are ratios or fractions: shown as "1.45×" and "87%".
_RATIO = re.compile(r"speed-?up|\bover\b|\bvs\b|\bratio\b|\bcost of\b|\w\s+/\s+\w")
_FRACTION = re.compile(r"\bof (ceiling|datasheet|peak)\b|\bshare\b|\befficiency\b")
_NOT_RATIO = re.compile(r"tokens\s*/\s*s|\bMB/step\b|TFLOP\s*/\s*s|GB\s*/\s*s|FLOP\s*/\s*step|"
                        r"GB moved\s*/|GFLOP\s*/|\bper\b|/\s*\(|tok/s")


# Integer columns that are names or coordinates rather than counts: no thousands separator.
_PLAIN_INT = {"T", "B", "seed", "round", "year", "commit"}


def _is_missing(v: Any) -> bool:
    if v is None or v is pd.NA or v is pd.NaT:
        return True
    return isinstance(v, float) and math.isnan(v)


def unit_kind(column: str) -> str:
    """'ratio', 'fraction' or 'number': how the values of ``column`` are shown."""
    c = str(column)
    if _FRACTION.search(c):
        return "fraction"
    if _RATIO.search(c) and not _NOT_RATIO.search(c):
        return "ratio"
    return "number"


# Columns whose values name a model, a case or an engine by the rows' preset keys ('gpt2 fuse_mlp_act=True'): each
# key in them is shown as the book names the model.
_MODEL_COLUMNS = ("model", "rung", "case", "cell", "engine")


def fmt(v: Any, digits: int = 3, column: str = "", decimals: int | None = None) -> str:
    """One cell: '–' when missing, yes/no, thousands separators, ``digits`` significant figures (or
    ``decimals`` places, for a column of figures compared digit by digit); ratios and fractions by the
    unit of ``column`` (see :func:`unit_kind`)."""
    if _is_missing(v) or (isinstance(v, str) and not v.strip()):
        return MISSING
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    kind = unit_kind(column) if column else "number"
    if isinstance(v, numbers.Integral):
        return str(int(v)) if column in _PLAIN_INT else f"{int(v):,}"
    if isinstance(v, numbers.Real):
        v = float(v)
        if math.isinf(v):
            return "∞" if v > 0 else "−∞"
        if kind == "fraction":
            return f"{100 * v:.{max(digits - 1, 0)}g}%" if abs(v) < 0.01 else f"{100 * v:.0f}%"
        if kind == "ratio":
            return f"{v:.2f}×" if abs(v) < 1000 else f"{v:,.0f}×"
        if decimals is not None:
            return f"{v:,.{decimals}f}"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        shown = f"{v:.{digits}g}"
        if float(shown) != v:
            # Rounded: keep the trailing zeros of its significant figures (2.998 -> '3.00', not '3'), so a
            # measured column reads digit by digit; an exact value (a setting such as 0.5 or 6e-4) stays short.
            shown = f"{v:#.{digits}g}".rstrip(".")
        return shown
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt(x, digits) for x in v)
    if column == "device" and isinstance(v, str):
        return gpu_label(v, keep_unknown=True)  # a results folder ('h100-80gb-hbm3') reads as its GPU
    if column in _MODEL_COLUMNS and isinstance(v, str):
        return model_title(v)  # a preset key ('gpt2 + MQA') reads as the model's name
    return str(v)


def _columns(rows: list[dict[str, Any]], columns: Sequence[str] | None) -> list[str]:
    if columns is not None:
        return list(columns)
    return list(dict.fromkeys(k for r in rows for k in r))


def to_frame(rows: Iterable[dict[str, Any]], columns: Sequence[str] | None = None) -> pd.DataFrame:
    """The rows as a DataFrame of raw values (one column per key, in ``columns`` order).

    Dtypes are inferred per column (nullable integers stay integers where a value is missing),
    so the frame is ready for grouping and arithmetic.
    """
    rows = list(rows)
    cols = _columns(rows, columns)
    frame = pd.DataFrame.from_records([{c: r.get(c) for c in cols} for r in rows], columns=cols)
    return frame.convert_dtypes()


def table_view(build: Callable[..., list[dict[str, Any]]]) -> Callable[..., pd.DataFrame]:
    """The one shape of a view: it builds its table as rows (dicts) and returns it as a DataFrame.

    The undecorated builder stays reachable as ``.rows``, for a view that composes another's rows
    and for tests that read them as dicts.
    """
    @functools.wraps(build)
    def view(*args: Any, **kwargs: Any) -> pd.DataFrame:
        return to_frame(build(*args, **kwargs))

    view.rows = build  # type: ignore[attr-defined]
    return view


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A table's rows as dicts, a missing value as None (a view that takes another's table)."""
    return [{k: (None if _is_missing(v) else v) for k, v in r.items()} for r in frame.to_dict("records")]


def _text_frame(frame: pd.DataFrame, digits: int, decimals: int | None = None) -> pd.DataFrame:
    """Every cell formatted by its column's unit."""
    return pd.DataFrame({c: [fmt(v, digits, c, decimals) for v in frame[c].tolist()] for c in frame.columns},
                        columns=frame.columns, index=range(len(frame)))


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Number) and not isinstance(v, (bool, np.bool_)) and not _is_missing(v)


def _numbers(frame: pd.DataFrame) -> pd.DataFrame:
    """True where a cell holds a number (not a flag, not missing): those are right-aligned."""
    return pd.DataFrame({c: [_is_number(v) for v in frame[c].tolist()] for c in frame.columns},
                        columns=frame.columns, index=range(len(frame)))


def text_table(cells: pd.DataFrame) -> str:
    """A pipe table of already formatted cells (the text/plain representation)."""
    cols = [model_title(str(c)) for c in cells.columns]
    head = "| " + " | ".join(cols) + " |"
    sep = "|" + "|".join("---" for _ in cols) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in cells.itertuples(index=False)]
    return "\n".join([head, sep, *body])


def md_table(rows: Iterable[dict[str, Any]], columns: Sequence[str] | None = None, digits: int = 3) -> str:
    """A GitHub-flavoured Markdown table of ``rows`` (cells formatted as in the HTML table)."""
    frame = to_frame(rows, columns)
    return text_table(_text_frame(frame, digits))


_STYLES = [
    {"selector": "", "props": "border-collapse: collapse; font-size: 0.85em; margin: 0.3em 0 0.8em 0;"},
    {"selector": "th", "props": "text-align: left; vertical-align: bottom; padding: 0.25em 0.6em; "
                                "border-bottom: 1px solid #888; font-weight: 600;"},
    {"selector": "td", "props": "padding: 0.2em 0.6em; border-bottom: 1px solid #e4e4e4; vertical-align: top;"},
    {"selector": "caption", "props": "caption-side: top; text-align: left; font-size: 0.95em; "
                                     "padding: 0.2em 0; color: #555;"},
]


def _uuid(key: str) -> str:
    return "ft" + hashlib.sha1(key.encode()).hexdigest()[:10]


def styled(cells: pd.DataFrame, nums: pd.DataFrame, uid: str, caption: str | None = None) -> str:
    """The HTML of a table of formatted cells: pandas Styler, no index, numbers right-aligned
    (``nums``: True where the cell is a number), a fixed id (``uid``) so the same table always
    gives the same HTML."""
    st = Styler(cells, uuid=uid, cell_ids=False)
    st = st.hide(axis="index").set_table_attributes('class="dataframe ftlib-table"')
    # A header that holds a preset key ('gpt2 ms') names the model as the book does ('GPT-2 ms').
    st = st.format_index(lambda c: model_title(str(c)), axis="columns")
    nums = nums.loc[:, cells.columns].reset_index(drop=True).set_axis(cells.index)
    # A column of numbers (and gaps) is aligned as a whole; in a mixed column only its numbers are.
    whole = [c for c in cells.columns if nums[c].any() and (nums[c] | (cells[c] == MISSING)).all()]
    right = {c: [{"selector": "td", "props": "text-align: right; white-space: nowrap;"},
                 {"selector": "th", "props": "text-align: right;"}] for c in whole}
    # A column of long texts (a configuration's name, a verdict's reason) squeezed into the page's width
    # wraps word by word into a tall row: give it a width of about half its longest text (capped).
    wide = {c: [{"selector": "td", "props": f"min-width: {min(22, n // 2)}em;"}]
            for c in cells.columns if c not in whole and (n := int(cells[c].astype(str).str.len().max() or 0)) > 24}
    st = st.set_table_styles(_STYLES).set_table_styles({**right, **wide}, overwrite=False)
    mixed = [c for c in cells.columns if c not in whole and nums[c].any()]
    if mixed:
        st = st.apply(lambda col: ["text-align: right; white-space: nowrap;" if n else "" for n in nums[col.name]],
                      axis=0, subset=mixed)
    if caption:
        st = st.set_caption(caption)
    return st.to_html()


def _csv_link(frame: pd.DataFrame, name: str) -> str:
    data = base64.b64encode(frame.to_csv(index=False).encode()).decode()
    return (f'<a download="{html.escape(name)}.csv" href="data:text/csv;charset=utf-8;base64,{data}">'
            f"download as CSV</a>")


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_-]+", "-", text).strip("-")[:60] or "table"


def table_bundle(rows: Iterable[dict[str, Any]], columns: Sequence[str] | None = None, digits: int = 3,
                 name: str | None = None, preview: Sequence[str] | None = None,
                 caption: str | None = None, decimals: int | None = None, head: int | None = None,
                 collapsed: bool = False) -> dict[str, str]:
    """The mime bundle :func:`show_table` displays (text/html and text/plain).

    With ``collapsed``, the whole table is folded (an HTML ``<details>``, its caption as the summary line)
    with no preview: for the full table under a condensed one.

    ``preview`` names the columns a wide table shows before its collapsed whole (default: the
    first ``MAX_COLUMNS``), ``head`` how many of a long table's first rows (default ``PREVIEW_ROWS``);
    ``name`` (default: derived from the content) names its CSV file;
    ``decimals`` shows every plain number with that many places instead of ``digits`` figures.
    """
    frame = to_frame(rows, columns)
    if frame.empty:
        what = html.escape(caption + ": " if caption else "") + "no rows"
        return {"text/html": f"<p><em>{what}</em></p>", "text/plain": f"({what})"}
    cells = _text_frame(frame, digits, decimals)
    nums = _numbers(frame)
    n_rows, n_cols = frame.shape
    key = "\x1f".join(map(str, cells.columns)) + "\x1e" + cells.to_csv(index=False) + (caption or "")
    uid = _uuid((name or "") + "\x1d" + key)
    plain = text_table(cells)
    if n_cols > MAX_COLUMNS and n_rows <= TRANSPOSE_ROWS and n_rows > 0:
        # One line per column; as few leading text columns as make unique names (device, model, ...)
        # name the rows' columns.
        text_cols = []
        for c in frame.columns[:3]:
            if nums[c].any():
                break
            text_cols.append(c)
        ids = [frame.columns[0]]
        for k in range(1, len(text_cols) + 1):
            ids = text_cols[:k]
            if len({tuple(cells[c][i] for c in ids) for i in range(n_rows)}) == n_rows:
                break
        heads = [" · ".join(str(cells[c][i]) for c in ids) for i in range(n_rows)]
        heads = [h if heads.count(h) == 1 else f"{h} ({i + 1})" for i, h in enumerate(heads)]
        label = " · ".join(map(str, ids))
        rest = [c for c in cells.columns if c not in ids]
        t = pd.DataFrame([[model_title(c), *cells[c].tolist()] for c in rest], columns=[label, *heads])
        t_nums = pd.DataFrame([[False, *nums[c].tolist()] for c in rest], columns=[label, *heads])
        body = styled(t, t_nums, uid, caption)
        return {"text/html": body, "text/plain": plain}
    if collapsed:
        summary = html.escape(f"{caption}: all" if caption else "All") + f" {n_rows} rows and {n_cols} columns"
        return {"text/html": f'<details class="ftlib-table-all"><summary>{summary}</summary>'
                             f'<div style="overflow-x: auto;">{styled(cells, nums, uid, None)}</div>'
                             f"<p>{_csv_link(frame, _slug(name or caption or uid))}</p></details>",
                "text/plain": plain}
    if n_rows <= MAX_ROWS and n_cols <= MAX_COLUMNS:
        return {"text/html": styled(cells, nums, uid, caption), "text/plain": plain}
    # Preview, then the whole table collapsed with a CSV of the raw values.
    show_cols = [c for c in (preview or list(cells.columns)[:MAX_COLUMNS]) if c in cells.columns]
    part = cells.loc[:, show_cols]
    what = []
    if n_rows > MAX_ROWS:
        part = part.head(head or PREVIEW_ROWS)
        what.append(f"the first {len(part)} of {n_rows} rows")
    if len(show_cols) < n_cols:
        what.append(f"{len(show_cols)} of {n_cols} columns")
    title = ((caption + ": ") if caption else "") + ("showing " + " and ".join(what) if what else "")
    summary = f"All {n_rows} rows and {n_cols} columns"
    body = (styled(part, nums.loc[part.index], uid + "p", title or None)
            + f'<details class="ftlib-table-all"><summary>{summary}</summary>'
            + f'<div style="overflow-x: auto;">{styled(cells, nums, uid, caption)}</div>'
            + f"<p>{_csv_link(frame, _slug(name or caption or uid))}</p></details>")
    return {"text/html": body, "text/plain": plain}


def show_table(rows: Iterable[dict[str, Any]], columns: Sequence[str] | None = None, digits: int = 3, *,
               name: str | None = None, preview: Sequence[str] | None = None, caption: str | None = None,
               decimals: int | None = None, head: int | None = None, collapsed: bool = False) -> None:
    """Display ``rows`` (dicts) as a table in a notebook: HTML with a plain-text twin (module docstring)."""
    from IPython.display import display

    display(table_bundle(rows, columns, digits, name=name, preview=preview, caption=caption, decimals=decimals,
                         head=head, collapsed=collapsed), raw=True)


def show_frame(frame: pd.DataFrame, digits: int = 3, **kw: Any) -> None:
    """:func:`show_table` for a DataFrame (its index is dropped; reset it first to keep it)."""
    show_table(frame.to_dict("records"), list(frame.columns), digits, **kw)


def group_rows(rows: Iterable[dict[str, Any]], *keys: str) -> dict[Any, list[dict[str, Any]]]:
    """Rows (dicts) grouped by the values of ``keys`` (default: the device), in order of first
    appearance: one group per device, say, so that rows of different devices are never pooled.

    Keys of one field give plain values, several give tuples; a missing field groups as None.
    """
    rows = list(rows)
    keys = keys or ("device_slug",)
    if not rows:
        return {}
    frame = pd.DataFrame({k: [r.get(k) for r in rows] for k in keys}, dtype=object)
    groups = frame.groupby(list(keys), sort=False, dropna=False).indices
    out = {}
    for key, idx in groups.items():
        key = tuple(None if _is_missing(k) else k for k in (key if isinstance(key, tuple) else (key,)))
        out[key[0] if len(keys) == 1 else key] = [rows[i] for i in sorted(idx)]
    return out
