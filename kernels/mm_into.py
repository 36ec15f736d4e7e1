"""A weight gradient written straight into an fp32 buffer: one GEMM, no new tensor, no add.

Used by the engine's Linear layers (``ftlib.training.engine.grad_into``) and by the fused MLP
(``kernels.gelu_mlp``) when their weight gradients go into a view of an optimizer's flat fp32
gradient. Plain PyTorch: this module does not import Triton.
"""

from __future__ import annotations

import functools

import torch


def _mm_fp32_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out (fp32) = a @ b for bf16 / fp16 a, b, in one cuBLAS call (``aten::mm.dtype_out``)."""
    torch.mm(a, b, out_dtype=torch.float32, out=out)


@functools.cache
def fp32_out_mm_available(device: torch.device) -> bool:
    """Whether ``torch.mm(bf16, bf16, out_dtype=torch.float32, out=...)`` runs on ``device`` (CUDA in
    recent PyTorch; not the CPU). Probed once per device, outside any graph capture."""
    a = torch.zeros(2, 2, dtype=torch.bfloat16, device=device)
    out = torch.empty(2, 2, dtype=torch.float32, device=device)
    try:
        _mm_fp32_out(a, a, out)
    except (TypeError, RuntimeError, NotImplementedError):
        return False
    return True


def weight_grad_into_(grad: torch.Tensor, dy2: torch.Tensor, x2: torch.Tensor, fp32_out: bool) -> None:
    """grad (N, K) = dy2^T @ x2 for dy2 (M, N), x2 (M, K), written in place (not added).

    Operands in grad's dtype: one GEMM into ``grad``. Low-precision operands: one GEMM with an fp32
    output where ``fp32_out`` (CUDA, :func:`fp32_out_mm_available`), else the low-precision GEMM
    copied (cast) into ``grad``."""
    if dy2.dtype == grad.dtype:
        torch.mm(dy2.t(), x2, out=grad)
    elif fp32_out and grad.dtype == torch.float32:
        _mm_fp32_out(dy2.t(), x2, grad)
    else:
        grad.copy_(torch.mm(dy2.t(), x2))
