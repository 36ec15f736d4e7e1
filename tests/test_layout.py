"""The package's shape: small modules, kernels that import only torch and triton, a quiet ``import ftlib``.

The import direction between ftlib's layers is checked by import-linter (``lint-imports``, the
contracts in pyproject.toml, run by ci/test); these tests check what it does not.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 400
LIBRARY = sorted([*ROOT.glob("ftlib/**/*.py"), *ROOT.glob("kernels/**/*.py")])


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(ROOT)))
def test_library_module_is_short(path: Path) -> None:
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(ROOT)} has {n} lines (at most {MAX_LINES}): split it by job"


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", sorted(ROOT.glob("kernels/**/*.py")), ids=lambda p: p.name)
def test_kernels_import_only_torch_and_triton(path: Path) -> None:
    allowed = {"torch", "triton", "kernels"} | set(sys.stdlib_module_names)
    assert _imported_roots(path) <= allowed, f"{path.name} imports {_imported_roots(path) - allowed}"


def test_import_contracts_are_declared() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = {c["id"]: c for c in cfg["contracts"]}
    assert contracts["layers"]["layers"] == ["views", "harness", "analysis | training", "model", "core"]
    assert set(contracts["kernels"]["forbidden_modules"]) == {"ftlib", "benchmarks"}
    assert contracts["benchmarks"]["source_modules"] == ["ftlib"]
    pins = (ROOT / "ci/requirements-ci.txt").read_text()
    assert "import-linter==" in pins and "lint-imports" in (ROOT / "ci/test").read_text()


def test_architecture_note_is_linked() -> None:
    assert (ROOT / "ARCHITECTURE.md").is_file()
    assert "ARCHITECTURE.md" in (ROOT / "README.md").read_text()


def test_import_ftlib_is_quiet() -> None:
    """``import ftlib`` prints nothing and changes no global torch setting."""
    code = (
        "import torch\n"
        "def flags():\n"
        "    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,\n"
        "            torch.get_float32_matmul_precision(), torch.get_default_dtype(),\n"
        "            torch.are_deterministic_algorithms_enabled())\n"
        "before = flags()\n"
        "import ftlib\n"
        "from ftlib import ModelConfig, preset, build_model, GPT, PRESETS\n"
        "assert flags() == before, (before, flags())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
