"""How ci/test shares the suite between pytest-xdist workers (tests/conftest.py's scheduler): which tests must
run together, in order, in one worker."""

from __future__ import annotations

import functools
import re
from pathlib import Path


@functools.cache
def _shares_a_module_fixture(path: Path) -> bool:
    """Whether a test module defines a fixture built once per module (or package), which its tests share."""
    text = path.read_text(encoding="utf-8") if path.suffix == ".py" and path.is_file() else ""
    return re.search(r"""scope=["'](module|package)["']""", text) is not None


def run_together(nodeid: str, root: Path) -> str:
    """The unit of work a test belongs to under ci/test's ``--dist loadgroup``: a notebook's cells (run in order
    in one kernel, as nbval needs), or a module whose tests share a module-scoped fixture; any other test is a
    unit of its own, so a long module no longer keeps one worker busy while the others idle. A test marked
    ``pytest.mark.xdist_group(name)`` (its node id ends in '@name' under loadgroup) joins that group's unit."""
    if "@" in nodeid:
        return "@" + nodeid.rsplit("@", 1)[1]
    path = nodeid.split("::", 1)[0]
    return path if path.endswith(".ipynb") or _shares_a_module_fixture(root / path) else nodeid
