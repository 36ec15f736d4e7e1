"""Hand-written Triton kernels for the FastTransformer book.

Every op follows the Liger-Kernel layering (Hsu et al. 2024, "Liger Kernel: Efficient
Triton Kernels for LLM Training", sec. 3): a ``@triton.jit`` kernel whose docstring states
the math, a launcher that checks device/dtype/shape and picks block sizes, a
``torch.autograd.Function``, and a thin ``nn.Module``. The plain-PyTorch references the
kernels are tested against live in :mod:`ftlib.model.reference`.

Importing this package never fails when Triton is missing (CPU-only installs) and does not
import Triton itself: check ``kernels.HAS_TRITON`` first; the op modules (``kernels.rmsnorm``
etc.) need Triton. Import neither prints nor changes global settings.
"""

from __future__ import annotations

import importlib.util


def _has_triton() -> bool:
    # Look Triton up without importing it: TRITON_INTERPRET=1 only takes effect if it is set
    # before the first `import triton`, and benchmarks/kernels sets it after importing this package.
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["triton"] is None (blocked)
        return False


HAS_TRITON = _has_triton()

__all__ = ["HAS_TRITON"]
