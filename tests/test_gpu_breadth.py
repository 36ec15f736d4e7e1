"""tests/gpu_breadth.py: the interpreter leaves out only the marked cases, and every test keeps a case there."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from gpu_breadth import NAME, case, left_out

HERE = Path(__file__).parent


def _item(*marks: str) -> SimpleNamespace:
    return SimpleNamespace(get_closest_marker=lambda name: name if name in marks else None)


def test_the_interpreter_leaves_out_the_marked_cases_and_the_compiled_kernels_run_them():
    plain, marked = _item("kernels"), _item("kernels", NAME)
    assert left_out([plain, marked], gpu_mode=False) == [marked]
    assert left_out([plain, marked], gpu_mode=True) == []


def _compiled_only(value) -> bool:
    """Whether a parametrize value is a ``gpu_breadth`` case (a plain value, or a pytest.param without it, is not)."""
    return any(m.name == NAME for m in getattr(value, "marks", ()))


def _cases_left_in_the_interpreter(function) -> list[int]:
    """For each parametrize decorator of ``function``: how many of its cases the interpreter runs."""
    return [sum(not _compiled_only(v) for v in mark.args[1])
            for mark in getattr(function, "pytestmark", []) if mark.name == "parametrize"]


def _marked_tests() -> dict[str, list[int]]:
    found = {}
    for path in sorted(HERE.glob("test_*.py")):
        if "gpu_breadth" not in path.read_text(encoding="utf-8") or path.name == Path(__file__).name:
            continue
        module = importlib.import_module(path.stem)
        for name, function in vars(module).items():
            values = [v for m in getattr(function, "pytestmark", []) if m.name == "parametrize" for v in m.args[1]]
            if name.startswith("test_") and any(map(_compiled_only, values)):
                found[f"{path.name}::{name}"] = _cases_left_in_the_interpreter(function)
    return found


def test_every_test_with_compiled_only_cases_keeps_one_in_the_interpreter():
    found = _marked_tests()
    assert len(found) >= 5, found  # the engine-option tests that mark their repeats
    assert all(counts and min(counts) >= 1 for counts in found.values()), found


def test_the_check_sees_a_test_with_every_case_marked():
    @pytest.mark.parametrize("x", [case(1, id="a"), case(2, id="b")])
    def all_marked(x):
        pass

    @pytest.mark.parametrize("x", [case(1, id="a"), pytest.param(2, id="b")])
    def one_left(x):
        pass

    assert _cases_left_in_the_interpreter(all_marked) == [0]
    assert _cases_left_in_the_interpreter(one_left) == [1]
