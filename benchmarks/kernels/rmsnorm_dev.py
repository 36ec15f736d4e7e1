"""RMSNorm forward + backward: check then time. ``python -m benchmarks.kernels.rmsnorm_dev [--check-only]``.

Variants: v1 eager reference (ftlib.model.norm.rms_norm_ref), v2 torch.compile of it, v3 the Triton
kernels in the model (kernels/rmsnorm.py), v4/v5 the experiment of benchmarks/kernels/rmsnorm_rows.py
(tiles of 16 / 4 rows per program, fwd and bwd). v5 won on the H200 (25.7 us fwd+bwd in a graph
against v3's 54, kernels.jsonl, 2026-12-02) and became the model's kernel: v3's stored rows were
measured on the first version (one row per program forward, a persistent backward grid; commit
f46d25d), later v3 runs time the 4-row kernel.
v6-v8: the backward's dweight partials on a persistent grid (``dw_partials="persistent"``: each program
loops over a run of row tiles and writes one partial row, so the final torch sum reads a few hundred
rows instead of cdiv(M, 4) = 2048): v6 the default grid (4-row tiles, 4 one-warp programs per SM),
v7 one program per SM (Liger's grid), v8 16-row tiles (4 warps, one program per SM).
Shape: the FastTransformer's norm input, (B*T, C) = (8192, 256), fp32 and bf16.
Bytes (the floor): forward reads x and writes y, backward reads x and dy and writes dx;
weight, rstd and the partial dweight sums are O(N + M) and left out.
"""

from __future__ import annotations

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch

    from benchmarks.kernels.rmsnorm_rows import rms_norm_rows
    from ftlib.model.reference import rms_norm_ref
    from kernels._common import num_programs
    from kernels.rmsnorm import rms_norm

    M, N = (8192, 256) if device.type == "cuda" else (37, 256)
    sms = num_programs(device, M)  # one program per SM (a few in the interpreter): the one-per-SM grid
    ok = True
    # One function per case so the closures below bind its arguments, not loop variables.
    def case(dtype, tol) -> bool:
        x = torch.randn(M, N, device=device, dtype=dtype, requires_grad=True)
        w = torch.ones(N, device=device, dtype=dtype).add_(0.1 * torch.randn(N, device=device, dtype=dtype))
        w.requires_grad_(True)
        dy = torch.randn(M, N, device=device, dtype=dtype)

        def fwd_bwd(f):
            return lambda: (lambda y: (y, *torch.autograd.grad(y, (x, w), dy)))(f(x, w, 1e-5))

        # fp64 reference from the same inputs
        x64, w64 = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)

        def reference():
            y = rms_norm_ref(x64, w64, 1e-5)
            return (y, *torch.autograd.grad(y, (x64, w64), dy.double()))

        compiled = torch.compile(rms_norm_ref) if device.type == "cuda" else rms_norm_ref
        variants = [
            Variant("v1 eager", fwd_bwd(rms_norm_ref), tol),
            Variant("v2 torch.compile", fwd_bwd(compiled), tol, gpu_only=True),
            Variant("v3 triton", fwd_bwd(rms_norm), tol),
            Variant("v4 triton 16 rows", fwd_bwd(lambda a, b, e: rms_norm_rows(a, b, e, 16)), tol),
            Variant("v5 triton 4 rows", fwd_bwd(lambda a, b, e: rms_norm_rows(a, b, e, 4)), tol),
            # v6-v8: the persistent dweight partials (no commas in the names: --variants splits on them)
            Variant("v6 triton persistent dw", fwd_bwd(lambda a, b, e: rms_norm(a, b, e, "persistent")), tol),
            Variant("v7 triton persistent dw 1 program per SM",
                    fwd_bwd(lambda a, b, e: rms_norm(a, b, e, "persistent", sms)), tol),
            Variant("v8 triton persistent dw 16 rows",
                    fwd_bwd(lambda a, b, e: rms_norm_rows(a, b, e, 16, "persistent")), tol),
        ]
        return run(f"rmsnorm fwd+bwd ({M}, {N}) {dtype}", args, device, reference, variants,
                  work=5 * M * N * x.element_size(), unit="GB/s", op="rmsnorm", shape={"M": M, "N": N}, dtype=dtype)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        ok &= case(dtype, tol)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
