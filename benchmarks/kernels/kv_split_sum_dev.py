"""The MQA dK/dV split sums of the attention backward: check then time.
``python -m benchmarks.kernels.kv_split_sum_dev [--check-only]``.

Why: with one K/V head shared by 8 query heads, the dK/dV kernel is split over the query heads
(``kernels/attention.py``, ``_kv_split``) and writes n_split fp32 partials of dK and of dV; the
backward then sums them, casts them and copies them into the packed d(qkv) buffer, up to six
launches per layer. Variants: v1 eager (what ``attention_bwd`` runs by default,
``ftlib.model.reference.kv_split_sum_ref``: ``view.sum(2)``, ``.to``, ``copy_`` for dK and dV),
v2 torch.compile of the same function, v3
``kernels/kv_split_sum.py`` (one launch for both, its default tile), v4-v5 the kernel on smaller
tiles (more programs: a memory-bound sum wants enough of them to fill the GPU's bandwidth).
Shape: the FastTransformer's (B=32, nkv=1, n_split=4, T=256, hs=32); outputs are the k and v
views of a packed (B, T, (nh + 2 nkv) hs) buffer in fp32 and bf16. Bytes (the floor): the
partials read once and the outputs written once.
"""

from __future__ import annotations

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch

    from ftlib.model.reference import kv_split_sum_ref
    from kernels.kv_split_sum import kv_split_sum

    cuda = device.type == "cuda"
    B, nh, nkv, n_split, T, hs = (32, 8, 1, 4, 256, 32) if cuda else (2, 4, 1, 2, 12, 8)
    ok = True

    def case(dtype, tol) -> bool:
        dk_part = torch.randn(B, nkv * n_split, T, hs, device=device)  # fp32 partials, as the kernel writes them
        dv_part = torch.randn_like(dk_part)
        qkv = torch.zeros(B, T, (nh + 2 * nkv) * hs, device=device, dtype=dtype)  # the packed d(qkv)
        C, kvd = nh * hs, nkv * hs
        dk_out = qkv[..., C:C + kvd].view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs), a view
        dv_out = qkv[..., C + kvd:].view(B, T, nkv, hs).transpose(1, 2)

        def torch_sums(dkp, dvp):
            kv_split_sum_ref(dkp, nkv, dk_out)  # (B, nkv * n_split, T, hs) -> the packed (B, nkv, T, hs) view
            kv_split_sum_ref(dvp, nkv, dv_out)
            return qkv

        def fused(tile=None):
            kv_split_sum(dk_part, dv_part, dk_out, dv_out, tile_elems=tile)
            return qkv

        compiled = torch.compile(torch_sums) if cuda else torch_sums

        def reference():
            ref = torch.zeros(B, T, (nh + 2 * nkv) * hs, device=device, dtype=torch.float64)
            ref[..., C:C + kvd] = dk_part.double().view(B, nkv, n_split, T, hs).sum(2).transpose(1, 2).reshape(
                B, T, kvd)
            ref[..., C + kvd:] = dv_part.double().view(B, nkv, n_split, T, hs).sum(2).transpose(1, 2).reshape(
                B, T, kvd)
            return ref

        variants = [Variant("v1 eager sum, cast, copy", lambda: torch_sums(dk_part, dv_part), tol),
                    Variant("v2 torch.compile", lambda: compiled(dk_part, dv_part), tol, gpu_only=True),
                    Variant("v3 triton fused, default tile", fused, tol)]
        for v, tile in (("v4", 1024), ("v5", 512)):
            variants.append(Variant(f"{v} triton fused, {tile}-element tile", lambda t=tile: fused(t), tol,
                                    gpu_only=True))
        out_bytes = 2 * B * nkv * T * hs * qkv.element_size()
        return run(f"kv split sum (B={B}, nkv={nkv}, n_split={n_split}, T={T}, hs={hs}) into {dtype}", args, device,
                   reference, variants, work=2 * dk_part.numel() * 4 + out_bytes, unit="GB/s", op="kv_split_sum",
                   shape={"B": B, "nkv": nkv, "n_split": n_split, "T": T, "hs": hs}, dtype=dtype)

    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        ok &= case(dtype, tol)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
