"""Where the repository is: the data, the results and the kernels' sources sit beside ftlib."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout holding ftlib/


def repo_root() -> Path:
    """The checkout (or copied tree) that holds ftlib/, kernels/ and data/."""
    return ROOT
