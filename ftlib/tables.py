"""Small tables for the book: rows of dicts rendered as Markdown (no pandas needed)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def fmt(v: Any, digits: int = 3) -> str:
    """Numbers with thousands separators or ``digits`` significant figures; '–' for None."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != v:
            return "nan"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}"
    return str(v)


def md_table(rows: Iterable[dict[str, Any]], columns: Sequence[str] | None = None, digits: int = 3) -> str:
    """A GitHub-flavoured Markdown table of ``rows`` (missing cells shown as '–')."""
    rows = list(rows)
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    head = "| " + " | ".join(columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(fmt(r.get(c), digits) for c in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def show_table(rows: Iterable[dict[str, Any]], columns: Sequence[str] | None = None, digits: int = 3) -> None:
    """Display :func:`md_table` in a notebook."""
    from IPython.display import Markdown, display

    display(Markdown(md_table(rows, columns, digits)))
