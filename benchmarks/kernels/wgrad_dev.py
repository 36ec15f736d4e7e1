"""A Linear's weight gradient into an fp32 buffer, dW = dY^T X: check then time.
``python -m benchmarks.kernels.wgrad_dev [--check-only] [--record]``.

Why: in the engine's bf16 FastTransformer step the weight gradients are cuBLAS GEMMs with an fp32
output (``grad_into_buffer``); at these shapes (M = 8192 rows reduced, outputs of 256 x 256 to
1024 x 256) cuBLAS splits the reduction and runs a ``splitKreduce`` kernel after 25 of them
(``benchmarks/kernels/engine_probe.py``). ``kernels/wgrad.py`` adds each slice's partial into the
output with atomic adds instead: one kernel per gradient. Variants: v1 cuBLAS with an fp32 output
(``torch.mm(..., out_dtype=torch.float32, out=c)``: what the engine runs now; bf16 only, it writes c),
v2 ``kernels.wgrad.wgrad_add_`` after zeroing c (the engine's flat gradient is zeroed once per step for
all of them, so the memset here counts against v2), v3 torch.compile of the low-precision GEMM and its
cast, v4 v2 with its atomic adds in relaxed memory order (engine option ``relaxed_atomics``). Shapes: the
Linears of the headline models (``ftlib.harness.suites.headline_models``, B x T = 8192 rows):
FastTransformer's qkv (MQA, 320 x 256), attention and MLP projections, GPT-2's qkv (768 x 256) and MLP
up-projection (1024 x 256); bf16, and fp32 with TF32 products (a tf32 step's). Work: 2 M N K FLOPs.
"""

from __future__ import annotations

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup

# (name, N, K): dW is (N, K) for a Linear from K to N features.
SHAPES = (("FT qkv", 320, 256), ("attn proj", 256, 256), ("FT mlp up", 512, 256), ("FT mlp down", 256, 512),
          ("GPT-2 qkv", 768, 256), ("GPT-2 mlp up", 1024, 256))


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch

    from ftlib.core.precision import Precision
    from ftlib.model.reference import wgrad_ref
    from kernels.mm_into import fp32_out_mm_available, weight_grad_into_
    from kernels.wgrad import wgrad_add_

    cuda = device.type == "cuda"
    M = 8192 if cuda else 48
    shapes = SHAPES if cuda else (("small", 24, 40),)
    fp32_out = fp32_out_mm_available(device)
    ok = True

    # One function per case so the closures below bind its arguments, not loop variables.
    def case(name: str, N: int, K: int, dtype, tol) -> bool:
        dy = torch.randn(M, N, device=device, dtype=dtype)
        x = torch.randn(M, K, device=device, dtype=dtype)
        c = torch.empty(N, K, device=device, dtype=torch.float32)
        prec = "tf32" if dtype == torch.float32 else "ieee"

        def cublas():
            weight_grad_into_(c, dy, x, fp32_out)
            return c

        def split_k(sem="acq_rel"):
            c.zero_()
            return wgrad_add_(c, dy, x, prec, sem)

        def low_then_cast(a, b):
            return torch.mm(a.t(), b).float()

        compiled = torch.compile(low_then_cast) if cuda else low_then_cast
        # fp32 operands run TF32 products, as in a tf32 step: the rows say so, so that their floor is TF32's.
        mm = "tf32" if dtype == torch.float32 else ""
        variants = [
            Variant("v1 cuBLAS into fp32" if fp32_out or dtype == torch.float32 else "v1 cuBLAS + cast", cublas, tol,
                    precision=mm),
            Variant("v2 triton split-K atomic", split_k, tol, precision=mm),
            Variant("v3 torch.compile", lambda: compiled(dy, x), tol, gpu_only=True, precision=mm),
            Variant("v4 triton split-K atomic, relaxed adds", lambda: split_k("relaxed"), tol, precision=mm),
        ]
        return run(f"wgrad {name} ({M}, {N}) x ({M}, {K}) {dtype}", args, device, lambda: wgrad_ref(dy, x),
                   variants, work=2 * M * N * K, unit="TFLOP/s", op="wgrad", shape={"M": M, "N": N, "K": K},
                   dtype=dtype)

    with Precision.of("tf32").matmul_flags():  # a tf32 step's cuBLAS products, for the fp32 cases
        for name, N, K in shapes:
            for dtype, tol in ((torch.bfloat16, 1e-2), (torch.float32, 5e-3)):
                ok &= case(name, N, K, dtype, tol)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
