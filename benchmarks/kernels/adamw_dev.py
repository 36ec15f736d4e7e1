"""AdamW step: check then time. ``python -m benchmarks.kernels.adamw_dev [--check-only]``.

Variants on the FastTransformer's parameters (2,559,744 fp32 values in ~40 tensors), all
after the same 3 warm steps: v1 torch.optim.AdamW foreach (the default on CUDA),
v2 fused=True, v3 capturable foreach, v4 the flat-buffer Triton kernel (one launch).
Bytes (the floor): 28 per parameter (read p, g, m, v; write p, m, v). The check compares
the update p - p0 after the steps (its error relative to the largest update) with the fp32
single-tensor reference (ftlib.model.reference).

Tolerances. p is stored in fp32 at |p| up to max|p0| (~5 at the GPU size), so one ulp of p is
already ~6e-4 of the largest update (3 steps of ~lr), the scale the error is divided by. Each
step rounds p twice (the decay, the update), and an implementation that orders that arithmetic
differently can land an ulp away at each rounding: torch's fused kernel computes
p -= lr*wd*p where the reference multiplies by (1 - lr*wd) rounded to fp32, and the fused and
capturable paths compute the bias corrections in fp32 on the device. On the H200 torch's fused
AdamW came out 1.5e-3 from the reference (2.4 such ulps), its foreach path 2.6e-4; on the CPU
(fused included) it is within 1e-4. So torch's variants get 2 ulps per step
(2 * steps * eps_fp32 * max|p0| over the largest update, ~3.9e-3 at the GPU size), still well
below what a wrong formula gives (an lr 1% off is 1e-2 of the update). The Triton kernel does
the reference's operations in the reference's order (kernels/adamw.py) and keeps 1e-3.
"""

from __future__ import annotations

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch

    from ftlib.model.reference import adamw_step_ref
    from kernels.adamw import adamw_step_

    if device.type == "cuda":
        from ftlib import build_model

        shapes = [tuple(p.shape) for p in build_model("fasttransformer").parameters()]
    else:
        shapes = [(65, 32), (16, 32), (32,), (40, 32), (32, 32), (32,)]
    sizes = [int(torch.Size(s).numel()) for s in shapes]
    n = sum(sizes)
    hp = dict(lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    g = torch.Generator(device="cpu").manual_seed(0)
    p0 = torch.randn(n, generator=g).to(device)
    grads = [0.1 * torch.randn(n, generator=g).to(device) for _ in range(3)]
    steps = len(grads)

    def reference():
        p, m, v = p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0)
        for s in range(steps):
            adamw_step_ref(p, grads[s], m, v, step=s + 1, **hp)
        return p - p0  # check the update, ~1e-3, not p itself, ~1, which would hide errors

    want = reference()
    ulp_p = torch.finfo(torch.float32).eps * p0.abs().max().item()  # >= one ulp of the largest |p|
    torch_tol = 2 * steps * ulp_p / want.abs().max().item()

    # Each variant is a callable running `steps` steps from its own state. The first call
    # (from the fresh state) is the one checked; the timing calls keep stepping the same state.
    def torch_variant(**kw):
        params = [t.clone().requires_grad_(True) for t in p0.split(sizes)]
        opt = torch.optim.AdamW(params, **hp, **kw)

        def go(check: bool = True):
            for s in range(steps):
                for prm, gs in zip(params, grads[s].split(sizes)):
                    prm.grad = gs
                opt.step()
            return torch.cat([prm.detach() for prm in params]) - p0 if check else None

        return go

    def flat_variant():
        p, m, v = p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0)
        step_t = torch.zeros((), device=device)
        lr_t = torch.tensor(hp["lr"], device=device)
        b = dict(betas=hp["betas"], eps=hp["eps"], weight_decay=hp["weight_decay"])

        def go(check: bool = True):
            for s in range(steps):
                step_t.add_(1)
                adamw_step_(p, grads[s], m, v, step_t, lr_t, **b)
            return p - p0 if check else None

        return go

    # torch refuses to capture an AdamW whose step counts live on the host (capturable=False).
    host_step = "torch.optim.AdamW(capturable=False) keeps its step count on the host: not capturable"

    def variant(name, go, gpu_only, tol, capturable=True):
        return Variant(name, go, tol, gpu_only=gpu_only, bench=lambda: go(False), capturable=capturable,
                       note="" if capturable else host_step)

    variants = [
        variant("v1 foreach", torch_variant(foreach=True), True, torch_tol, capturable=False),
        variant("v2 fused", torch_variant(fused=True), True, torch_tol, capturable=False),
        variant("v3 capturable", torch_variant(foreach=True, capturable=True), True, torch_tol),
        variant("v4 triton flat", flat_variant(), False, 1e-3),
    ]
    ok = run(f"AdamW x{steps} steps over {n:,} params ({len(sizes)} tensors)", args, device, reference,
             variants, work=28 * n * steps, unit="GB/s", op="adamw",
             shape={"n_params": n, "tensors": len(sizes), "steps": steps}, dtype=torch.float32)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
