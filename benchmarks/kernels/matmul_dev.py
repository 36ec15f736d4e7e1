"""Linear-layer GEMMs of one training step: cuBLAS vs a Triton GEMM, check then time.

    python -m benchmarks.kernels.matmul_dev [--check-only] [--json OUT.json]

Why: in strict fp32 the FastTransformer step is matmul-bound (chapter 01's compile-ro
profile: ~3.1 ms of SIMT SGEMM in a 5.8 ms step, ~39 TFLOP/s of the FMA units' 67), so no
elementwise fusion reaches a 1.5x speed-up. What is left is the tensor cores at fp32
accuracy: 3xTF32 (Triton's ``input_precision='tf32x3'``; each fp32 operand = TF32 head +
TF32 tail, three MMAs, NVIDIA/cutlass discussion 385) has ~fp32 error at up to a third of
the TF32 rate. This driver measures it on the step's own shapes before anything enters the
model: the forward ``y = x W^T``, the input gradient ``dx = dy W`` and the weight gradient
``dW = dy^T x`` (K = B*T = 8192: split-K so a 320x256 output still fills 132 SMs).

Variants per shape: v1 cuBLAS strict fp32, v2 cuBLAS TF32, v3 Triton ieee, v4 Triton tf32x3,
v5 Triton tf32 (the Triton variants run kernels/linear.py's tile kernel at each of
``CONFIGS`` and keep the fastest). Each GEMM is timed as one call per CUDA-graph replay with a
cold L2 (``_harness.time_graph``). ``h200-matmul.log`` was taken with an earlier timer (10
back-to-back calls per replay, warm L2), so its times are a little lower than this one's.
"""

from __future__ import annotations

import json
import sys

import torch

from benchmarks.kernels._harness import parse_args, setup, time_graph

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): the configurations tried per shape.
CONFIGS = ((128, 128, 32, 8, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 32, 4, 4))


def triton_mm(a: torch.Tensor, b: torch.Tensor, prec: str, cfg: tuple[int, ...], split: int = 1) -> torch.Tensor:
    """a (M, K) @ b (K, N) in fp32 through kernels/linear.py's tile kernel at one fixed config."""
    import triton
    import triton.language as tl

    from kernels.linear import _matmul_tile_kernel

    M, K = a.shape
    N = b.shape[1]
    BM, BN, BK, warps, stages = cfg
    k_per = triton.cdiv(triton.cdiv(K, split), BK) * BK
    out = torch.empty((split, M, N), device=a.device, dtype=torch.float32)
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN), split)
    _matmul_tile_kernel[grid](a, b, out, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                              out.stride(0), out.stride(1), out.stride(2), k_per, HAS_BIAS=False, PREC=prec,
                              CD=tl.float32, GROUP_M=8, BM=BM, BN=BN, BK=BK, num_warps=warps, num_stages=stages)
    return out[0] if split == 1 else out.sum(0)


def step_shapes(
    C: int = 256, tokens: int = 8192, outs: tuple[int, ...] = (320, 256, 512)
) -> list[tuple[str, int, int, int, str]]:
    """(name, M, K, N, kind) of the FastTransformer layer's GEMMs: forward, dX, dW per weight."""
    shapes = []
    for n_out, n_in in [(o, C) for o in outs] + [(C, 2 * C)]:
        shapes.append((f"fwd {n_in}->{n_out}", tokens, n_in, n_out, "fwd"))
        shapes.append((f"dX {n_out}->{n_in}", tokens, n_out, n_in, "dx"))
        shapes.append((f"dW {n_out}x{n_in}", n_out, tokens, n_in, "dw"))
    return shapes


def _graph_us(fn) -> tuple[float, float, float]:
    """(median, p20, p80) microseconds of one call in a CUDA graph replay (the harness's timer)."""
    t = time_graph(fn)
    return t["median_us"], t["p20_us"], t["p80_us"]


def _operands(M: int, K: int, N: int, kind: str, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A (M, K), B (K, N) laid out as autograd hands them to the GEMM (transposes are views)."""
    if kind == "fwd":  # x (M, K) @ W^T, W stored (N, K)
        return torch.randn(M, K, device=device), torch.randn(N, K, device=device).t()
    if kind == "dx":  # dy (M, K) @ W, W stored (K, N)
        return torch.randn(M, K, device=device), torch.randn(K, N, device=device)
    return torch.randn(K, M, device=device).t(), torch.randn(K, N, device=device)  # dy^T @ x


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap_args = parse_args(__doc__, [a for a in argv if not a.startswith("--json=")])
    json_out = next((a.split("=", 1)[1] for a in argv if a.startswith("--json=")), None)
    device = setup(ap_args)
    cuda = device.type == "cuda"
    rows, ok = [], True
    shapes = step_shapes() if cuda else [("odd fwd", 37, 40, 29, "fwd"), ("odd dW", 24, 70, 33, "dw")]
    for name, M, K, N, kind in shapes:
        a, b = _operands(M, K, N, kind, device)
        want = a.double() @ b.double()
        flops = 2.0 * M * N * K
        splits = (1,) if kind != "dw" or not cuda else (1, 4, 8, 16)
        cfgs = CONFIGS if cuda else ((16, 16, 16, 4, 1),)
        best: dict[str, tuple] = {}
        variants = [("v3 triton ieee", "ieee", 1e-5), ("v4 triton tf32x3", "tf32x3", 1e-5),
                    ("v5 triton tf32", "tf32", 5e-3)]
        for vname, prec, tol in variants:
            for cfg in cfgs:
                for sp in splits:
                    fn = (lambda a=a, b=b, cfg=cfg, sp=sp, prec=prec: triton_mm(a, b, prec, cfg, sp))
                    got = fn()
                    err = ((got.double() - want).abs().max() / want.abs().max()).item()
                    if err > tol:
                        print(f"{name:>14} {vname}: cfg {cfg} split {sp} err {err:.2e} > {tol:.0e} FAIL")
                        ok = False
                        continue
                    if not cuda:
                        best[vname] = (0.0, 0.0, 0.0, cfg, sp, err)
                        continue
                    t = _graph_us(fn)
                    if vname not in best or t[0] < best[vname][0]:
                        best[vname] = (*t, cfg, sp, err)
        if cuda:
            for vname, tf32 in (("v1 cublas fp32", False), ("v2 cublas tf32", True)):
                old = torch.backends.cuda.matmul.allow_tf32
                torch.backends.cuda.matmul.allow_tf32 = tf32
                try:
                    got = a @ b
                    err = ((got.double() - want).abs().max() / want.abs().max()).item()
                    t = _graph_us(lambda a=a, b=b: a @ b)  # captured under the flag: the graph keeps its math mode
                finally:
                    torch.backends.cuda.matmul.allow_tf32 = old
                best[vname] = (*t, None, 1, err)
        for vname in sorted(best):
            med, p20, p80, cfg, sp, err = best[vname]
            tflops = flops / (med * 1e-6) / 1e12 if med else None
            rows.append(dict(op="gemm", shape=name, M=M, K=K, N=N, kind=kind, variant=vname, median_us=med,
                             p20_us=p20, p80_us=p80, tflops=tflops, config=cfg, split_k=sp, rel_err=err))
            print(f"{name:>14} {vname:>18}: {med:8.1f} us [{p20:.1f}, {p80:.1f}] "
                  f"{(tflops or 0):6.1f} TFLOP/s err {err:.1e} cfg {cfg} split {sp}", flush=True)
    if cuda:
        tot: dict[str, float] = {}
        for r in rows:
            tot[r["variant"]] = tot.get(r["variant"], 0.0) + r["median_us"]
        print("per-layer total (one of each GEMM): " + ", ".join(f"{k} {v:.0f} us" for k, v in sorted(tot.items())))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
