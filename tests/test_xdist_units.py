"""ci/test's units of work for pytest-xdist (tests/xdist_units.py): a notebook's cells stay together and in
order, a module sharing a module-scoped fixture stays together, so do the tests of one xdist_group, and any
other test goes alone."""

from pathlib import Path

from xdist_units import run_together

ROOT = Path(__file__).resolve().parent.parent


def test_a_notebooks_cells_are_one_unit():
    assert {run_together(f"book/07_claims.ipynb::Cell {i}", ROOT) for i in range(5)} == {"book/07_claims.ipynb"}


def test_a_module_with_a_module_fixture_is_one_unit_and_other_tests_go_alone():
    assert 'scope="module"' in (ROOT / "tests" / "test_html.py").read_text()
    assert run_together("tests/test_html.py::test_a", ROOT) == run_together("tests/test_html.py::test_b", ROOT) \
        == "tests/test_html.py"
    assert "scope=" not in (ROOT / "tests" / "test_engine_explicit_attention.py").read_text()
    ids = [f"tests/test_engine_explicit_attention.py::test_x[{p}]" for p in ("bf16", "tf32")]
    assert [run_together(i, ROOT) for i in ids] == ids


def test_tests_marked_with_one_xdist_group_are_one_unit():
    ids = ["tests/test_a.py::test_x@serial", "tests/test_b.py::test_y[1]@serial"]
    assert {run_together(i, ROOT) for i in ids} == {"@serial"}
