"""The output head and the loss, forward and backward: check then time.
``python -m benchmarks.kernels.head_loss_dev [--check-only]``.

Why: the engine's head is a GEMM with V = 65 output columns, whose rows are not 16-byte aligned, followed by
the cross-entropy kernel and two more GEMMs for dx and dW (engine option ``fuse_head_loss`` puts all of it in
``kernels/linear_cross_entropy.py``'s two kernels). Each variant runs the whole of it for rows x (M, C) and the
head w (V, C) in bf16: the loss, dx, and dW written or added into a zeroed fp32 buffer (the head's view of the
engine's flat gradient). v1 what the engine runs without the option: the head GEMM, the cross-entropy kernel
(``kernels/cross_entropy.py``), dx = dlogits w and dW = dlogitsᵀ x with an fp32 output. v2 torch.compile of
F.linear and F.cross_entropy, forward and backward. v3 the fused kernels on the launcher's blocks (64 rows on a GPU), v4
and v5 on 128 and 32 rows (fewer or more programs, and so fewer or more atomic adds into dW).
Bytes (the floor): x read and dx written once each (the logits never stored).
"""

from __future__ import annotations

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch
    import torch.nn.functional as F

    from ftlib.model.reference import linear_cross_entropy_ref
    from kernels.cross_entropy import cross_entropy_fwd
    from kernels.linear_cross_entropy import linear_cross_entropy_bwd, linear_cross_entropy_fwd

    cuda = device.type == "cuda"
    M, C, V = (8192, 256, 65) if cuda else (37, 32, 65)
    dtype = torch.bfloat16
    g = torch.Generator().manual_seed(0)
    x = torch.randn(M, C, generator=g).to(device, dtype)
    w = (torch.randn(V, C, generator=g) / C ** 0.5).to(device, dtype)
    t = torch.randint(0, V, (M,), generator=g).to(device)
    dw = torch.zeros(V, C, device=device, dtype=torch.float32)
    one = torch.ones((), device=device)

    def reference():
        xr, wr = x.double().requires_grad_(True), w.double().requires_grad_(True)
        loss = linear_cross_entropy_ref(xr, wr, t)
        return (loss, *torch.autograd.grad(loss, (xr, wr)))

    def unfused():
        loss, dl = cross_entropy_fwd(x @ w.t(), t, check_targets=False)  # (M, V) logits, then dlogits
        dx = dl @ w
        if cuda:  # cuBLAS with an fp32 output, as the engine writes the head's weight gradient
            torch.mm(dl.t(), x, out_dtype=torch.float32, out=dw)
        else:
            dw.copy_(dl.t() @ x)
        return loss, dx, dw

    def torch_step(x, w):
        xx, ww = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
        loss = F.cross_entropy(F.linear(xx, ww).float(), t)
        return (loss, *torch.autograd.grad(loss, (xx, ww)))

    compiled = torch.compile(torch_step) if cuda else torch_step

    def fused(block_m=None):
        loss, lse, n_valid = linear_cross_entropy_fwd(x, w, t, block_m=block_m)
        dx = linear_cross_entropy_bwd(x, w, t, lse, n_valid, one, dw.zero_(), block_m=block_m)
        return loss, dx, dw

    tol = 3e-2  # bf16 operands and gradients against fp64
    variants = [Variant("v1 head GEMM, cross-entropy kernel, dx and dW GEMMs", unfused, tol),
                Variant("v2 torch.compile", lambda: compiled(x, w), tol, gpu_only=True),
                Variant("v3 fused kernels, the launcher's blocks", fused, tol, impl="triton")]
    if cuda:
        variants += [Variant(f"v{i} fused kernels, {bm}-row blocks", lambda bm=bm: fused(bm), tol, impl="triton")
                     for i, bm in ((4, 128), (5, 32))]
    ok = run(f"head and loss ({M}, {C}) -> {V}", args, device, reference, variants,
             work=2 * M * C * x.element_size(), unit="GB/s", op="head_loss", shape={"M": M, "C": C, "V": V},
             dtype=dtype)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
