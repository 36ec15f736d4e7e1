"""Test-session setup.

Triton's CPU interpreter must be switched on before the first ``import triton`` (torch may
import it early, e.g. through torch.utils.flop_counter), so it is set here, before any test
module is imported. On a GPU machine set FTLIB_TEST_GPU=1 to compile kernels for real.
"""

import os

if os.environ.get("FTLIB_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
