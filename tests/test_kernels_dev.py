"""The kernels/dev check-then-time drivers pass their checks in --check-only mode (interpreter, tiny sizes)."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # must precede the first `import triton` (see kernels/README.md)

import importlib  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("triton")

from kernels._common import interpreter_ready  # noqa: E402

# When triton was imported before TRITON_INTERPRET=1 (torch imports it in some test modules),
# this process cannot interpret kernels (tests/conftest.py sets TRITON_INTERPRET before triton loads).
pytestmark = pytest.mark.skipif(not interpreter_ready(), reason="triton imported before TRITON_INTERPRET=1")


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "cross_entropy", "adamw", "attention"])
def test_dev_driver_checks_pass(op, capsys):
    mod = importlib.import_module(f"kernels.dev.{op}_dev")
    assert mod.main(["--check-only"]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "FAIL" not in out
