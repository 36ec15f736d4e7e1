"""The attention backward with MQA's query heads split over 1 to 8 programs per K/V head: check then time.
``python -m benchmarks.kernels.attention_kv_split_dev [--check-only] [--record]``.

Why: with one K/V head shared by 8 query heads, the dK/dV kernel's grid is (key blocks, B x n_split):
``_kv_split`` in ``kernels/attention.py`` picks n_split for about two programs per SM (4 at the
headline shape), and n_split > 1 writes fp32 partials that one more kernel sums into the packed
d(qkv) (``kernels/kv_split_sum.py``). n_split = 1 writes dk/dv directly with no partials and no
sum, each program looping over all 8 heads; larger splits put more programs in flight. Variants:
the whole backward (the dQ kernel, the dK/dV kernel, the fused sum where split) at n_split = 1, 2,
4, 8, the launcher's choice first. Shape: the FastTransformer's attention at the book's headline
(B=32, nh=8, nkv=1, T=256, hs=32), bf16. Work: the causal backward's FLOPs, 2.5x the forward's
(4 B nh T^2 hs / 2 forward).
"""

from __future__ import annotations

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch

    from ftlib.model.reference import causal_attention_ref
    from kernels.attention import attention_bwd, attention_fwd

    cuda = device.type == "cuda"
    B, nh, nkv, T, hs = (32, 8, 1, 256, 32) if cuda else (1, 8, 1, 37, 32)
    dtype, tol = torch.bfloat16, 3e-2
    g = torch.Generator().manual_seed(0)
    q, do = (torch.randn(B, nh, T, hs, generator=g).to(device, dtype) for _ in range(2))
    k, v = (torch.randn(B, nkv, T, hs, generator=g).to(device, dtype) for _ in range(2))
    o, lse = attention_fwd(q, k, v)

    def backward(split: int | None):
        def call():
            return attention_bwd(do, q, k, v, o, lse, kv_split=split, fuse_kv_split_sum=True)
        return call

    def checked(call):
        def one_tensor():  # the three gradients as one tensor for the check (not timed: Variant.bench)
            return torch.cat([t.flatten() for t in call()]).float()
        return one_tensor

    def reference():
        qr, kr, vr = (t.double().requires_grad_(True) for t in (q, k, v))
        grads = torch.autograd.grad(causal_attention_ref(qr, kr, vr), (qr, kr, vr), do.double())
        return torch.cat([t.flatten() for t in grads])

    splits = [("v1 launcher's split", None)] + [(f"v{i} split {n}", n) for i, n in enumerate((1, 2, 4, 8), 2)]
    variants = [Variant(name, checked(backward(n)), tol, bench=backward(n), impl="triton") for name, n in splits]
    ok = run(f"attention bwd B={B} nh={nh} nkv={nkv} T={T} hs={hs} {dtype}", args, device, reference, variants,
             work=int(2.5 * 4 * B * nh * T * T * hs / 2), unit="TFLOP/s", op="attention_kv_split",
             shape={"B": B, "nh": nh, "nkv": nkv, "T": T, "hs": hs}, dtype=dtype)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
