"""How close a kernel must come to its fp64 reference: a bound from the error a correct
implementation makes in the same storage dtype, not a multiple of the tensor's shape.

The kernels store in a dtype D (fp32, bf16, fp16) and compute in fp32. A correct
implementation in D still differs from the fp64 reference: it rounds its output (half an ulp of
D) and, in PyTorch's own op run in D from the same inputs, rounds intermediates too. So a
kernel's largest error is set against

    bound = FACTOR * max(e_torch, eps_D * M / 2) + FP32_ULPS * eps_fp32 * M

where e_torch = max |PyTorch op in D - reference| (computed on the CPU), M = max |reference|, and
eps_D * M / 2 is about half an ulp of D at the largest value (the output's own rounding).

* FACTOR = 3: a correct kernel's error stays within about twice PyTorch's (Triton's interpreter
  truncates fp32 to bf16 where PyTorch rounds to nearest, up to twice the rounding error), while
  a systematic error of a few percent (a gradient 4% off) is several times PyTorch's error even
  in bf16 and far more in fp32, so it fails.
* FP32_ULPS = 16: the kernels' own fp32 arithmetic, which PyTorch's op does not share: another
  summation order, and on NVIDIA GPUs Triton's default fp32 division and square root, which are
  approximate (kernels/adamw.py's docstring; it uses the IEEE-rounded ``div_rn``/``sqrt_rn``
  where it must match torch bit for bit). Negligible next to a bf16 or fp16 rounding, it
  matters only for fp32 outputs.
"""

from __future__ import annotations

import torch

FACTOR = 3.0
FP32_ULPS = 16


def max_error(got: torch.Tensor, ref64: torch.Tensor) -> float:
    """Largest |got - ref| with got moved to the CPU in fp64 (ref is an fp64 CPU tensor)."""
    return (got.detach().cpu().double() - ref64.detach()).abs().max().item()


def error_bound(ref64: torch.Tensor, torch_lowp: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """(bound, e_torch) for a kernel output stored in ``dtype``; ``torch_lowp`` is PyTorch's op
    computed in that dtype from the same inputs."""
    m = ref64.detach().abs().max().item()
    e_torch = max_error(torch_lowp, ref64)
    half_ulp = 0.5 * torch.finfo(dtype).eps * m
    return FACTOR * max(e_torch, half_ulp) + FP32_ULPS * torch.finfo(torch.float32).eps * m, e_torch


def assert_within_lowp_error(got: torch.Tensor, ref64: torch.Tensor, torch_lowp: torch.Tensor, name: str) -> None:
    """AssertionError unless the kernel output ``got`` is within :func:`error_bound` of ``ref64``."""
    err = max_error(got, ref64)
    bound, e_torch = error_bound(ref64, torch_lowp, got.dtype)
    assert err <= bound, (f"{name} ({got.dtype}): max |error| {err:.3g} > bound {bound:.3g} "
                          f"(PyTorch in {torch_lowp.dtype}: {e_torch:.3g}; tests/kernel_tolerance.py)")


# TF32 keeps 10 of fp32's 23 mantissa bits in a product's inputs: its unit roundoff is 2^-11 (NVIDIA's
# Ampere architecture whitepaper, "TF32"). Two correct tf32 training steps that reach their matrix
# products by different kernels (cuBLAS's TF32 GEMMs against a Triton kernel's tl.dot in tf32) round
# different inputs in a different order, so their gradients differ by a few units of it, relative to the
# gradient's norm: TF32_GRAD_RTOL is 8 of them (about 4e-3). A wrong gradient (a missing term, a
# transposed operand) is off by order 1.
TF32_UNIT_ROUNDOFF = 2.0 ** -11
TF32_GRAD_RTOL = 8 * TF32_UNIT_ROUNDOFF


def flat_grad_errors(on, off) -> dict[str, float]:
    """Per parameter of two engines (``ftlib.training.engine.Engine``, the same parameters): the relative error
    |g_on - g_off| / |g_off| of the gradients their last step left in their flat buffers (``off``'s as the
    reference; a zero reference counts as 1e-12)."""
    out = {}
    for name, (start, size) in on.spans.items():
        g_on, g_off = on.flat_grad[start:start + size], off.flat_grad[start:start + size]
        out[name] = ((g_on - g_off).norm() / g_off.norm().clamp_min(1e-12)).item()
    return out
