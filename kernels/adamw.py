"""One fused AdamW step over flat fp32 buffers, CUDA-graph capturable.

kernel (``_adamw_kernel``) -> launcher (``adamw_step_``) -> ``FlatAdamW`` (the optimizer
layer; an optimizer has no autograd.Function). Reference: :func:`ftlib.model.reference.adamw_step_ref`,
itself checked against ``torch.optim.AdamW``.

Why flat buffers: the model has ~50 parameter tensors; a per-tensor optimizer launches
~50 x (several) kernels per step, which at B=32, T=256 is a visible share of a step that
is launch-bound (far from its FLOP floor). With every parameter a
view into one fp32 buffer (and every grad a view into another) the whole update is one
launch, reading 16 and writing 12 bytes per parameter (p, g, m, v in; p, m, v out).

Weight decay: a segment boundary, not a per-element mask. The buffer holds the decayed
parameters (matrices) first and the undecayed ones (biases, gains) after, the two groups
of :func:`ftlib.training.step.param_groups`; the kernel decays elements [0, n_decay). A mask
buffer would cost 4 more bytes per element per step for the same information.

Graph capture: the step count and the learning rate are read from device tensors inside
the kernel, so a captured graph replays with the new values (as torch's
``capturable=True``); nothing here syncs with the host. The step increment is a separate
``step_t += 1`` before the launch: doing it inside the kernel would race with the other
programs reading it.

Loss scaling (fp16): with ``grad_scaling=(grad_mul, found_inf)`` the kernel reads the
gradients as ``g * grad_mul`` (the inverse loss scale, times the clip coefficient when
clipping: one multiply instead of an unscale pass and a clip pass over the buffer) and, when
``found_inf`` is nonzero, skips the whole update: every load and store is masked off, so
params and moments stay as they were. Deciding that needs every gradient, i.e. a reduction
before the launch (``ftlib.training.loss_scale.DeviceLossScale`` takes it from the gradient norm);
the caller also leaves the step count where it was on a skipped step (``step_t += 1 -
found_inf``), as ``torch.amp.GradScaler.step`` does (it does not call ``optimizer.step()``,
and fused AdamW takes ``found_inf`` back off its step count).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import triton
import triton.language as tl

from kernels._common import check_tensor, interpret_mode, same_device
from kernels.pdl import _grid_dependency, pdl_args


@triton.jit
def _adamw_kernel(
    P, G, M, V,  # flat fp32 buffers of N elements: param, grad, exp_avg, exp_avg_sq
    STEP, LR,  # 1-element device tensors: step t (after increment), learning rate
    GRAD_MUL, FOUND_INF,  # 1-element fp32 device tensors, read only when SCALED (module docstring)
    N, n_decay,
    beta1_hi, beta1_lo, beta2_hi, beta2_lo, wd_hi, wd_lo,  # fp64 constants as fp32 hi + lo pairs
    one_minus_beta1, beta2_f32, one_minus_beta2, eps,  # the fp32 constants torch's tensor ops use
    BLOCK: tl.constexpr, LERP_FROM_END: tl.constexpr, SCALED: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Elementwise AdamW (Loshchilov & Hutter 2019, Alg. 2, decoupled decay), in torch's order:

        p <- p * (1 - lr wd)                        only for element index < n_decay
        m <- m + (1 - b1) (g - m)                   torch.lerp's formula for weight < 0.5
        v <- v b2 + (1 - b2) g g
        p <- p - [lr / (1 - b1^t)] * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    The per-step scalars (bias corrections, step size, decay factor) are computed in fp64
    from the device step and lr, then rounded to fp32 once, because torch.optim.AdamW
    computes them in Python doubles: in fp32, 1 - 0.999^1 would already be off by 1e-5
    relative. betas and wd arrive as fp32 hi/lo pairs (hi + lo carries ~48 bits) since
    Triton passes Python floats as fp32. sqrt_rn / div_rn are IEEE-rounded like torch's
    (Triton's default fp32 ``/`` and ``sqrt`` are approximate on NVIDIA GPUs).
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    if SCALED:  # loss scaling (module docstring): on inf/nan nothing is loaded or stored
        N = tl.where(tl.load(FOUND_INF) == 0.0, N, 0)
    mask = offs < N

    step = tl.load(STEP).to(tl.float64)
    lr = tl.load(LR).to(tl.float64)
    beta1 = tl.cast(beta1_hi, tl.float64) + tl.cast(beta1_lo, tl.float64)
    beta2 = tl.cast(beta2_hi, tl.float64) + tl.cast(beta2_lo, tl.float64)
    wd = tl.cast(wd_hi, tl.float64) + tl.cast(wd_lo, tl.float64)
    bias_correction1 = 1.0 - tl.exp(step * tl.log(beta1))  # 1 - beta1^t
    bias_correction2 = 1.0 - tl.exp(step * tl.log(beta2))
    step_size = (lr / bias_correction1).to(tl.float32)
    bc2_sqrt = tl.sqrt(bias_correction2).to(tl.float32)
    decay = (1.0 - lr * wd).to(tl.float32)

    p = tl.load(P + offs, mask=mask, other=0.0)
    g = tl.load(G + offs, mask=mask, other=0.0)
    m = tl.load(M + offs, mask=mask, other=0.0)
    v = tl.load(V + offs, mask=mask, other=0.0)
    if SCALED:
        g = g * tl.load(GRAD_MUL)  # 1/S, times the clip coefficient when clipping

    p = tl.where(offs < n_decay, p * decay, p)
    if LERP_FROM_END:  # torch.lerp switches formula at weight 0.5 for accuracy
        m = g - (g - m) * (1.0 - one_minus_beta1)
    else:
        m = m + one_minus_beta1 * (g - m)
    v = v * beta2_f32 + one_minus_beta2 * g * g
    denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    p = p - step_size * tl.div_rn(m, denom)

    tl.store(P + offs, p, mask=mask)
    tl.store(M + offs, m, mask=mask)
    tl.store(V + offs, v, mask=mask)


def _split(x: float) -> tuple[float, float]:
    """x as fp32 hi + fp32 lo (x - hi rounded), so the kernel can rebuild x to ~48 bits."""
    hi = float(torch.tensor(x, dtype=torch.float32))
    lo = float(torch.tensor(x - hi, dtype=torch.float32))
    return hi, lo


def _f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def adamw_step_(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: torch.Tensor,
    lr: torch.Tensor,
    *,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    n_decay: int | None = None,
    block: int | None = None,
    grad_scaling: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """In-place AdamW step on flat contiguous fp32 buffers of N elements.

    step, lr: 1-element device tensors (step already incremented: 1 on the first call).
    n_decay: elements [0, n_decay) get weight decay (all N when None).
    block: elements per program; None: 1024 on a GPU, 16,384 in the interpreter, which emulates each program
    in Python and so pays per program, not per element.
    grad_scaling: (grad_mul, found_inf), 1-element fp32 device tensors: the gradients are
    used times grad_mul, and nothing changes when found_inf != 0 (module docstring).

    Steps count from 1: at step 0 the bias corrections 1 - beta^0 are 0 and the update divides
    by zero, writing NaN into every parameter. A Python number passed as ``step`` is refused
    (step < 1 with that reason; any number because the kernel reads a device tensor). A device
    tensor's value is not checked: reading it needs a host sync, which a CUDA graph capture
    does not allow and which would stall every eager step; callers increment it before the
    call, as ``FlatAdamW.step`` does.
    """
    if isinstance(step, (int, float)) and not isinstance(step, bool) and step < 1:
        raise ValueError(f"step={step}: AdamW steps count from 1 (at step 0 the bias correction 1 - beta**0 "
                         "is 0 and the update would write NaN); increment the step before calling adamw_step_")
    names = ("param", "grad", "exp_avg", "exp_avg_sq")
    bufs = (param, grad, exp_avg, exp_avg_sq)
    for name, t in zip(names, bufs):
        check_tensor(name, t, dtypes=(torch.float32,), ndim=1)
    N = param.numel()
    for name, t in zip(names[1:], bufs[1:]):
        if t.numel() != N:
            raise ValueError(f"{name} has {t.numel()} elements, param has {N}")
    for name, t in (("step", step), ("lr", lr)):
        check_tensor(name, t, dtypes=(torch.float32, torch.float64, torch.int32, torch.int64), contiguous=False)
        if t.numel() != 1:
            raise ValueError(f"{name} must be a 1-element device tensor, got shape {tuple(t.shape)}")
    same_device(*zip(names + ("step", "lr"), bufs + (step, lr)))
    n_decay = N if n_decay is None else int(n_decay)
    if not 0 <= n_decay <= N:
        raise ValueError(f"n_decay={n_decay} outside [0, {N}]")
    beta1, beta2 = betas
    if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
        raise ValueError(f"betas must lie in [0, 1), got {betas}")
    if grad_scaling is not None:
        for name, t in zip(("grad_mul", "found_inf"), grad_scaling):
            check_tensor(name, t, dtypes=(torch.float32,), contiguous=False)
            if t.numel() != 1:
                raise ValueError(f"{name} must be a 1-element device tensor, got shape {tuple(t.shape)}")
        same_device(("param", param), ("grad_mul", grad_scaling[0]), ("found_inf", grad_scaling[1]))
    if N == 0:
        return
    b1, b2, wd = _split(beta1), _split(beta2), _split(weight_decay)
    grad_mul, found_inf = grad_scaling if grad_scaling is not None else (lr, lr)  # unread when not SCALED
    if block is None:
        block = 16384 if interpret_mode() else 1024
    _adamw_kernel[(triton.cdiv(N, block),)](
        param, grad, exp_avg, exp_avg_sq, step, lr, grad_mul, found_inf, N, n_decay,
        b1[0], b1[1], b2[0], b2[1], wd[0], wd[1],
        _f32(1 - beta1), _f32(beta2), _f32(1 - beta2), _f32(eps),
        BLOCK=block, LERP_FROM_END=(1 - beta1) >= 0.5, SCALED=grad_scaling is not None, num_warps=4,
        **pdl_args(param),
    )


class FlatAdamW:
    """AdamW over all parameters packed in one flat fp32 buffer, one kernel per step.

    On construction every parameter's storage moves into ``self.param`` (``p.data`` becomes
    a view) and every ``p.grad`` becomes a view into ``self.grad``, so autograd accumulates
    straight into the flat buffer. Consequences: ``zero_grad`` zeroes the buffer (there is
    no set_to_none, which would detach the grads from it), and the model must not be
    re-created or moved afterwards. Groups follow :func:`ftlib.training.step.param_groups`:
    any number of groups, but only one nonzero weight decay value. Not supported:
    amsgrad, maximize, per-group lr or betas.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter] | Iterable[dict],
        lr: float = 3e-4,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        items = list(params)
        groups = items if items and isinstance(items[0], dict) else [{"params": items}]
        decay, no_decay, wds = [], [], set()
        for g in groups:
            wd = g.get("weight_decay", weight_decay)
            (decay if wd != 0 else no_decay).extend(g["params"])
            if wd != 0:
                wds.add(wd)
        if len(wds) > 1:
            raise ValueError(f"FlatAdamW supports one nonzero weight decay value, got {sorted(wds)}")
        params_all = decay + no_decay
        if not params_all:
            raise ValueError("FlatAdamW got no parameters")
        device = params_all[0].device
        for i, p in enumerate(params_all):
            if p.dtype != torch.float32 or p.device != device:
                raise TypeError(f"parameter {i} is {p.dtype} on {p.device}; FlatAdamW needs fp32 on {device}")
        self.betas, self.eps = betas, eps
        self.weight_decay = wds.pop() if wds else 0.0
        self.params = params_all
        total = sum(p.numel() for p in params_all)
        self.n_decay = sum(p.numel() for p in decay)
        self.param = torch.empty(total, dtype=torch.float32, device=device)
        self.grad = torch.zeros(total, dtype=torch.float32, device=device)
        self.exp_avg = torch.zeros(total, dtype=torch.float32, device=device)
        self.exp_avg_sq = torch.zeros(total, dtype=torch.float32, device=device)
        off = 0
        with torch.no_grad():
            for p in params_all:
                n = p.numel()
                self.param[off : off + n].copy_(p.reshape(-1))  # any shape -> (n,)
                p.data = self.param[off : off + n].view_as(p)
                p.grad = self.grad[off : off + n].view_as(p)
                off += n
        # Device scalars, as torch's capturable AdamW keeps them: graph replays read them.
        self.step_t = torch.zeros((), dtype=torch.float32, device=device)
        self.lr = torch.tensor(lr, dtype=torch.float32, device=device)

    def set_lr(self, lr: float) -> None:
        """Change the learning rate in place (a captured graph sees the new value)."""
        self.lr.fill_(lr)

    def zero_grad(self, set_to_none: bool = False) -> None:
        if set_to_none:
            raise ValueError("FlatAdamW keeps grads as views into one buffer; use zero_grad(set_to_none=False)")
        self.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        self.step_t += 1
        adamw_step_(
            self.param, self.grad, self.exp_avg, self.exp_avg_sq, self.step_t, self.lr,
            betas=self.betas, eps=self.eps, weight_decay=self.weight_decay, n_decay=self.n_decay,
        )
