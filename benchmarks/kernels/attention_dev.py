"""Causal attention forward + backward: check then time. ``python -m benchmarks.kernels.attention_dev [--check-only]``.

Shape: the FastTransformer's attention, B=32, nh=8, T=256, hs=32, with nkv=1 (MQA) and 8.
Variants: v1 explicit reference (materializes (B, nh, T, T)), v2 SDPA with a stride-0
expanded K/V (memory-efficient kernel in fp32), v3 Triton 'ieee' fp32, v4 Triton
'tf32', v7 Triton 'tf32x3', and in bf16 v5 SDPA and v6 Triton; with a shared K/V head (nkv < nh), v8 (bf16)
and v9 ('tf32') the Triton kernels with the query heads of each K/V head packed into one tile (``pack_heads``:
each K/V block loaded once for all of them, where one program per head loads it nh / nkv times); v10 (bf16) and
v11 ('tf32') the Triton kernels launched heaviest block first (``heavy_first``: each row's causal block with the
most blocks to visit starts before the lighter ones, which fill the tail); v12 (bf16) and v13 ('tf32') the dK/dV
kernel's key blocks paired (``pair_key_blocks``: program j takes key blocks j and n - 1 - j, all with the same
causal work, and the launcher's split of the query heads sees the halved grid).
FLOPs: the causal half of the 4 matmuls' worth forward (4 B nh T^2 hs / 2) and 2.5x that backward
(FlashAttention-2 paper's convention, sec. 4.1: 5 matmuls vs 2); the Triton backward actually does 7 (QK^T twice).
Bytes (the memory floor): forward reads q, k, v and writes o; backward reads q, k, v, o, dO
and writes dq, dk, dv: 6 q-sized and 6 k-sized tensors (the logsumexp is O(B nh T)).
"""

from __future__ import annotations

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch
    import torch.nn.functional as F

    from ftlib.model.attention import kv_for_sdpa
    from ftlib.model.reference import causal_attention_ref
    from kernels.attention import flash_attention

    cuda = device.type == "cuda"
    B, nh, T, hs = (32, 8, 256, 32) if cuda else (1, 4, 37, 32)
    blk = {} if cuda else dict(block_m=16, block_n=16)
    ok = True
    # One function per case so the closures below bind its arguments, not loop variables.
    def case(nkv: int, dtype: torch.dtype) -> bool:
        mk = lambda h: torch.randn(B, h, T, hs, device=device, dtype=dtype, requires_grad=True)
        q, k, v = mk(nh), mk(nkv), mk(nkv)
        do = torch.randn(B, nh, T, hs, device=device, dtype=dtype)
        pack = min(nh // nkv, 16)  # every query head of a K/V head in one tile (pack_heads' limit: 16)

        def fwd_bwd(f):
            return lambda: (lambda o: (o, *torch.autograd.grad(o, (q, k, v), do)))(f(q, k, v))

        def sdpa(q_, k_, v_):
            k2, _ = kv_for_sdpa(k_, nh, "expand")
            v2, _ = kv_for_sdpa(v_, nh, "expand")
            return F.scaled_dot_product_attention(q_, k2, v2, is_causal=True)

        ins64 = [t.detach().double().requires_grad_(True) for t in (q, k, v)]

        def reference():
            o = causal_attention_ref(*ins64)
            return (o, *torch.autograd.grad(o, ins64, do.double()))

        if dtype == torch.float32:
            variants = [
                Variant("v1 explicit", fwd_bwd(causal_attention_ref), 1e-5, gpu_only=True),
                Variant("v2 sdpa expand", fwd_bwd(sdpa), 1e-5, gpu_only=True),
                Variant("v3 triton ieee", fwd_bwd(lambda a, b, c: flash_attention(a, b, c, **blk)), 1e-5),
                Variant("v4 triton tf32", fwd_bwd(
                    lambda a, b, c: flash_attention(a, b, c, input_precision="tf32", **blk)), 5e-3,
                    precision="tf32"),
                # 3xTF32: three tensor-core products per dot, ~fp32 accuracy (kernels/attention.py)
                Variant("v7 triton tf32x3", fwd_bwd(
                    lambda a, b, c: flash_attention(a, b, c, input_precision="tf32x3", **blk)), 1e-4,
                    precision="tf32x3"),
            ]
            variants.append(Variant("v11 triton tf32, heavy first", fwd_bwd(
                lambda a, b, c: flash_attention(a, b, c, input_precision="tf32", **blk, heavy_first=True)), 5e-3,
                precision="tf32"))
            variants.append(Variant("v13 triton tf32, key blocks paired", fwd_bwd(
                lambda a, b, c: flash_attention(a, b, c, input_precision="tf32", **blk, pair_key_blocks=True)),
                5e-3, precision="tf32"))
            if pack > 1:
                variants.append(Variant("v9 triton tf32, heads packed", fwd_bwd(
                    lambda a, b, c: flash_attention(a, b, c, input_precision="tf32", **blk, pack_heads=pack)), 5e-3,
                    precision="tf32"))
        else:
            variants = [
                Variant("v5 sdpa bf16", fwd_bwd(sdpa), 3e-2, gpu_only=True),
                Variant("v6 triton bf16", fwd_bwd(lambda a, b, c: flash_attention(a, b, c, **blk)), 3e-2),
            ]
            variants.append(Variant("v10 triton bf16, heavy first", fwd_bwd(
                lambda a, b, c: flash_attention(a, b, c, **blk, heavy_first=True)), 3e-2))
            variants.append(Variant("v12 triton bf16, key blocks paired", fwd_bwd(
                lambda a, b, c: flash_attention(a, b, c, **blk, pair_key_blocks=True)), 3e-2))
            if pack > 1:
                variants.append(Variant("v8 triton bf16, heads packed", fwd_bwd(
                    lambda a, b, c: flash_attention(a, b, c, **blk, pack_heads=pack)), 3e-2))
        flops = 4 * B * nh * T * T * hs / 2 * (1 + 2.5)
        nbytes = 6 * (q.numel() + k.numel()) * q.element_size()
        return run(f"causal attention fwd+bwd B={B} nh={nh} nkv={nkv} T={T} hs={hs} {dtype}", args, device,
                  reference, variants, unit="TFLOP/s", op="attention", flops=flops, nbytes=nbytes,
                  shape={"B": B, "nh": nh, "nkv": nkv, "T": T, "hs": hs}, dtype=dtype)
    for nkv in (1, nh):
        for dtype in (torch.float32, torch.bfloat16):
            ok &= case(nkv, dtype)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
