"""Shared memory the attention kernels need, compiled ahead of time over a grid of tiles.

Writes one JSON line per compilation (the grid point, shared bytes, first MMA instruction, FMAs):
head sizes 32/64/128, tiles 64x64/64x32/32x64/32x32, 1 and 2 stages, fp32 (ieee dots, and tf32
where Triton has MMA) and fp16, for sm_75, sm_80 and sm_90. ``kernels.tiles._SMEM_COEF``
are the smallest coefficients of its estimate that bound every line; rerun after a Triton
upgrade when tests/test_aot.py finds a compiled kernel over the estimate. The lines behind the
current coefficients (Triton 3.9) are in attention_smem_sweep.jsonl. Needs TRITON_INTERPRET
unset; takes ~25 minutes on one core.

    python -m benchmarks.kernels.attention_smem_sweep OUT.jsonl [--cc 75,80,90]
"""

from __future__ import annotations

import argparse
import itertools
import json

from kernels import aot
from kernels import attention as A
from kernels.tiles import Tiles

KERNELS = {"fwd": "_attn_fwd_kernel", "bwd_dq": "_attn_bwd_dq_kernel", "bwd_dkdv": "_attn_bwd_dkdv_kernel"}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--cc", default="75,80,90")
    args = ap.parse_args(argv)
    grid = itertools.product((32, 64, 128), ((64, 64), (64, 32), (32, 64), (32, 32)), (1, 2))
    with open(args.out, "a") as out:
        for cc in (int(c) for c in args.cc.split(",")):
            variants = [("fp32", "ieee"), ("fp16", "ieee")] + ([("fp32", "tf32")] if cc >= 80 else [])
            for (hs, (bm, bn), stages), (dt, prec), (name, fn) in itertools.product(grid, variants, KERNELS.items()):
                spec = aot.attention_spec(name, getattr(A, fn), hs, dt, prec, Tiles(bm, bn, 4, stages))
                r = aot.compile_spec(spec, cc)
                row = {"cc": cc, "kname": name, "hs": hs, "bm": bm, "bn": bn, "st": stages, "dt": dt, "prec": prec,
                       "shared": r["shared"], "mma": r["mma"][:1], "fma": r["fma"]}
                out.write(json.dumps(row) + "\n")
                out.flush()

if __name__ == "__main__":
    main()
