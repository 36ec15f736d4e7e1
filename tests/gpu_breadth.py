"""Cases that run only where the kernels compile.

The Triton interpreter costs seconds per engine step, and many engine-option tests cross models with precisions:
in the interpreter most of that cross product repeats code paths another case already runs. A case marked
``gpu_breadth`` is one of those repeats: ``ci/test`` (the interpreter) leaves it out, ``ci/test-kernels-gpu``
(``FTLIB_TEST_GPU=1``, kernels compiled) runs it, so the whole cross product still runs wherever the kernel tests
run on a GPU. Every test keeps at least one case in the interpreter (tests/test_gpu_breadth.py checks that).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

NAME = "gpu_breadth"
MARK = getattr(pytest.mark, NAME)


def case(*values: Any, id: str) -> Any:  # noqa: A002 - pytest.param's own keyword
    """One parametrized case that runs only with the kernels compiled on a GPU."""
    return pytest.param(*values, id=id, marks=MARK)


def left_out(items: Sequence[pytest.Item], gpu_mode: bool) -> list[pytest.Item]:
    """The collected tests the interpreter leaves out: the ``gpu_breadth`` cases, unless the kernels compile."""
    return [] if gpu_mode else [item for item in items if item.get_closest_marker(NAME) is not None]
