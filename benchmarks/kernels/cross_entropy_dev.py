"""Cross-entropy forward + backward: check then time. ``python -m benchmarks.kernels.cross_entropy_dev [--check-only]``.

Variants: v1 eager F.cross_entropy, v2 torch.compile of it, v3 the fused Triton kernel (loss
and dlogits in one pass). Shape: the book's head output, N = B*T = 8192 rows, V = 65.
Bytes (the floor): read the logits once, write dlogits once (plus the backward's scale).
"""

from __future__ import annotations

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch

    from ftlib.model.reference import cross_entropy_ref
    from kernels.cross_entropy import cross_entropy

    N, V = (8192, 65) if device.type == "cuda" else (37, 65)
    ok = True
    # One function per case so the closures below bind its arguments, not loop variables.
    def case(dtype, tol) -> bool:
        z = (3 * torch.randn(N, V, device=device)).to(dtype).requires_grad_(True)
        t = torch.randint(0, V, (N,), device=device)

        def fwd_bwd(f):
            return lambda: (lambda loss: (loss, *torch.autograd.grad(loss, z)))(f(z, t))

        z64 = z.detach().double().requires_grad_(True)

        def reference():
            loss = cross_entropy_ref(z64, t)
            return (loss, *torch.autograd.grad(loss, z64))

        compiled = torch.compile(cross_entropy_ref) if device.type == "cuda" else cross_entropy_ref
        variants = [
            Variant("v1 eager F.cross_entropy", fwd_bwd(cross_entropy_ref), tol),
            Variant("v2 torch.compile", fwd_bwd(compiled), tol, gpu_only=True),
            Variant("v3 triton fused", fwd_bwd(cross_entropy), tol),
        ]
        return run(f"cross-entropy fwd+bwd ({N}, {V}) {dtype}", args, device, reference, variants,
                  work=2 * N * V * z.element_size(), unit="GB/s", op="cross_entropy", shape={"N": N, "V": V},
                  dtype=dtype)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        ok &= case(dtype, tol)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
