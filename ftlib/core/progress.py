"""One progress bar for every long loop (sweeps, training runs)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def progress_bar(iterable: Iterable, show: bool = True, **kwargs: Any) -> Any:
    """A tqdm bar over ``iterable`` (a notebook widget where ipywidgets is installed), or the
    plain iterable when ``show`` is False: importing ``tqdm.auto`` in a notebook without
    ipywidgets prints a warning into the cell even when the bar is disabled."""
    if not show:
        return _Quiet(iterable)
    from tqdm.auto import tqdm

    return tqdm(iterable, **kwargs)


class _Quiet:
    """An iterable with tqdm's ``set_postfix*`` and ``close`` as no-ops and its ``write``."""

    def __init__(self, iterable: Iterable) -> None:
        self._it = iterable

    def __iter__(self):
        return iter(self._it)

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_postfix_str(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass

    @staticmethod
    def write(msg: str) -> None:
        print(msg)  # as tqdm.write does with the bar disabled
