"""Bias gradient (column sum of dy over the rows): check then time.
``python -m benchmarks.kernels.bias_grad_dev [--check-only]``.

Why: in GPT-2's engine step PyTorch's ``dy.sum(0)`` for the 24 Linear biases is ~0.47 ms of
3.79 ms (``benchmarks/kernels/engine_probe.py``, H200, tf32), ~13-20 us per call for 8192 rows.
Variants: v1 eager ``dy.sum(0)`` (what autograd runs for ``F.linear``'s bias), v2 torch.compile
of it, v3 ``kernels/bias_linear.py``'s two-stage Triton column sum (32 x 64 tiles, 4 warps, ~2
programs per SM), v4-v6 the same kernel on other tiles and more programs per SM (v3 streamed
at only ~1 TB/s in fp32 and lost to torch.compile at N = 768 and 1024). Shapes: dy (8192, N) for
GPT-2's four Linear widths N = 768 (qkv), 256 (proj), 1024 (MLP up), 256 (MLP down), fp32 and
bf16. Bytes (the floor): dy read once; the (N,) result is left out.

v7 and v8 are the pair the engine option ``bias_into_buffer`` decides between, each ending in an fp32
gradient buffer zeroed first (the engine zeroes its flat gradient once per step): v7 the one-stage kernel
adding into it atomically (``bias_grad_add_``), v8 the launcher's two stages and then the add that autograd
runs into the buffer.

GELU's backward with the up-projection's bias gradient (the engine's default ``fc_bias_into_gelu``), at the
MLP's width (N = 1024): g1 torch's GELU backward then the column sum (what the engine ran before), g2
torch.compile of the same, g3 ``gelu_bwd_bias_add_`` on the launcher's tiles, g4-g7 on other tiles and
programs per SM (the launcher's were chosen for a sum that only reads; this one reads z and da and writes dz).
Bytes (the floor): z and da read, dz written, once each.
"""

from __future__ import annotations

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch

    from ftlib.model.reference import gelu_bias_grad_ref
    from kernels.bias_linear import bias_grad, bias_grad_add_, gelu_bwd_bias_add_

    cuda = device.type == "cuda"
    M = 8192 if cuda else 37
    widths = (768, 256, 1024) if cuda else (40, 17)
    ok = True

    # One function per case so the closures below bind its arguments, not loop variables.
    def case(N: int, dtype, tol) -> bool:
        dy = torch.randn(M, N, device=device, dtype=dtype)

        def torch_sum(t):
            return t.sum(0)

        compiled = torch.compile(torch_sum) if cuda else torch_sum
        variants = [
            Variant("v1 eager sum(0)", lambda: torch_sum(dy), tol),
            Variant("v2 torch.compile", lambda: compiled(dy), tol, gpu_only=True),
            # v3: 32x64 tiles, 2 programs per SM (the launcher takes v5's tiles for N >= 512)
            Variant("v3 triton column sum", lambda: bias_grad(dy, dtype, blocks=(32, 64, 4), per_sm=2), tol,
                    impl="triton"),
        ]
        for v, blocks, per_sm in (("v4", (64, 64, 4), 4), ("v5", (32, 128, 4), 4), ("v6", (16, 256, 4), 8)):
            variants.append(Variant(f"{v} triton column sum {blocks[0]}x{blocks[1]}, {per_sm}/SM",
                                    lambda b=blocks, p=per_sm: bias_grad(dy, dtype, blocks=b, per_sm=p), tol,
                                    impl="triton"))
        buf = torch.zeros(N, device=device, dtype=torch.float32)  # a bias's view of the flat gradient
        variants += [
            Variant("v7 atomic add into the zeroed fp32 gradient", lambda: bias_grad_add_(dy, buf.zero_()), tol,
                    impl="triton"),
            Variant("v8 two stages, then added into the zeroed fp32 gradient",
                    lambda: buf.zero_().add_(bias_grad(dy, torch.float32)), tol, impl="triton"),
        ]
        return run(f"bias grad ({M}, {N}) {dtype}", args, device, lambda: dy.double().sum(0), variants,
                   work=M * N * dy.element_size(), unit="GB/s", op="bias_grad", shape={"M": M, "N": N},
                   dtype=dtype)

    def gelu_case(N: int, dtype, tol) -> bool:
        z, da = (torch.randn(M, N, device=device, dtype=dtype) for _ in range(2))
        buf = torch.zeros(N, device=device, dtype=torch.float32)  # the bias's view of the flat gradient

        def unfused(z, da, buf):
            dz = torch.ops.aten.gelu_backward(da, z, approximate="tanh")  # what autograd runs for F.gelu
            return dz, buf.add_(dz.sum(0, dtype=torch.float32))

        compiled = torch.compile(unfused) if cuda else unfused
        variants = [Variant("g1 eager gelu backward, then sum(0)", lambda: unfused(z, da, buf.zero_()), tol),
                    Variant("g2 torch.compile", lambda: compiled(z, da, buf.zero_()), tol, gpu_only=True),
                    Variant("g3 triton gelu backward + column sum",
                            lambda: (gelu_bwd_bias_add_(z, da, buf.zero_(), "tanh"), buf), tol, impl="triton")]
        for v, blocks, per_sm in (("g4", (32, 128, 4), 8), ("g5", (64, 128, 8), 4), ("g6", (16, 256, 4), 8),
                                  ("g7", (32, 64, 4), 8)):
            variants.append(Variant(
                f"{v} triton gelu backward + column sum {blocks[0]}x{blocks[1]} w{blocks[2]}, {per_sm}/SM",
                lambda b=blocks, p=per_sm: (gelu_bwd_bias_add_(z, da, buf.zero_(), "tanh", blocks=b, per_sm=p), buf),
                tol, impl="triton"))
        return run(f"gelu backward + bias grad ({M}, {N}) {dtype}", args, device,
                   lambda: gelu_bias_grad_ref(z.double(), da.double()), variants,
                   work=3 * M * N * z.element_size(), unit="GB/s", op="gelu_bias_grad", shape={"M": M, "N": N},
                   dtype=dtype)

    for N in widths:
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            ok &= case(N, dtype, tol)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        ok &= gelu_case(widths[-1] if cuda else widths[0], dtype, tol)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
