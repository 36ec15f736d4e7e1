"""Flat buffers and the optimizer that works on them.

Every parameter is a view into one fp32 buffer and every gradient a view into one fp32 grad
buffer, decayed matrices first (the two groups of ``ftlib.training.step.param_groups``). Then
AdamW is one elementwise kernel over the whole model (``kernels/adamw.py``, which decays the
first ``n_decay`` elements), and zero_grad is one memset. The gradients keep fixed addresses:
set_to_none would make every backward allocate new grad tensors that a flat optimizer could not
read through one pointer, and that a captured graph could not replay. The cost: autograd adds
each new gradient into its view (AccumulateGrad's in-place branch), one add per parameter; for the
Linear weights the option ``grad_into_buffer`` writes the GEMM there instead (``grad_into.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from ftlib.training.loss_scale import DeviceLossScale, LossScaleConfig, make_grad_scaler


def flatten_parameters_(
    params: list[nn.Parameter],
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
    """Move every parameter into one flat fp32 buffer and bind its ``.grad`` to one flat grad buffer.

    After the call ``p.data`` is a view ``flat_param[off : off + n].view_as(p)`` and ``p.grad``
    the same slice of ``flat_grad`` (zeros), in the order given. Returns
    (flat_param (N,), flat_grad (N,), [(offset, numel)] per parameter). The grads must then
    never be set to None (``model.zero_grad()`` would detach them from the buffer).
    """
    device = params[0].device
    for i, p in enumerate(params):
        if p.dtype != torch.float32 or p.device != device:
            raise TypeError(f"parameter {i} is {p.dtype} on {p.device}; flat buffers need fp32 on {device}")
    total = sum(p.numel() for p in params)
    flat_param = torch.empty(total, dtype=torch.float32, device=device)
    flat_grad = torch.zeros(total, dtype=torch.float32, device=device)
    spans, off = [], 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat_param[off : off + n].copy_(p.reshape(-1))  # any shape -> (n,)
            p.data = flat_param[off : off + n].view_as(p)
            p.grad = flat_grad[off : off + n].view_as(p)
            spans.append((off, n))
            off += n
    return flat_param, flat_grad, spans


class FlatOptimizer:
    """AdamW over the flat buffers: the flat AdamW kernel (``kernel=True``), or torch's AdamW on the
    two parameter groups (fused and capturable on CUDA). fp16 adds dynamic loss scaling: on the
    device with the kernel (it unscales and skips the update on inf/nan, no host sync), else
    ``torch.amp.GradScaler``. Every piece of state stays at a fixed address, so a captured step
    replays it and :meth:`reset_` can restore a fresh optimizer in place.
    """

    def __init__(self, flat_param: torch.Tensor, flat_grad: torch.Tensor, n_decay: int,
                 groups: tuple[list[nn.Parameter], list[nn.Parameter]], *, kernel: bool, lr: float,
                 betas: tuple[float, float], eps: float, weight_decay: float, loss_scaling: bool,
                 loss_scale_config: LossScaleConfig, precision: str, skip: int = 0) -> None:
        # AdamW updates elements [skip, N): the first ``skip`` belong to another optimizer (Muon),
        # but clipping and loss scaling see the whole gradient.
        if skip and loss_scaling:
            raise ValueError("fp16 loss scaling with a second optimizer on the flat buffer is not supported")
        self.flat_param, self.flat_grad, self.n_decay, self.skip = flat_param, flat_grad, n_decay, skip
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
        # Called right after the backward, before clipping, unscaling or the update read the gradients
        # (the engine's weight-gradient side stream joins there: wgrad_stream.py).
        self.join_backward: Callable[[], None] | None = None
        device = flat_param.device
        self.loss_scale: DeviceLossScale | None = None
        self.scaler: torch.amp.GradScaler | None = None
        if loss_scaling and kernel:
            self.loss_scale = DeviceLossScale(device, loss_scale_config)
        elif loss_scaling:
            self.scaler = make_grad_scaler(precision, device, loss_scale_config)
            self._scaler_state0 = self.scaler.state_dict()
        self.torch_adamw: torch.optim.AdamW | None = None
        if kernel:
            # State as flat as the parameters; step and lr are device scalars, read by the kernel on
            # every replay (torch's capturable=True keeps them on the device too).
            self.exp_avg = torch.zeros_like(flat_param[skip:])
            self.exp_avg_sq = torch.zeros_like(flat_param[skip:])
            self.step_t = torch.zeros((), dtype=torch.float32, device=device)
            self.lr_t = torch.tensor(lr, dtype=torch.float32, device=device)
            self.name = "flat-adamw-triton"
            return
        decay, no_decay = groups
        param_groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        if device.type == "cuda":
            # The best capturable PyTorch AdamW: one fused kernel per group, step on the device
            # (what the benchmark's cudagraph mode uses). Its lr is a device tensor too: a float lr
            # would be baked into the captured graph, and a schedule must reach every replay.
            lr_t = torch.tensor(lr, dtype=torch.float32, device=device)
            self.torch_adamw = torch.optim.AdamW(param_groups, lr=lr_t, betas=betas, eps=eps, fused=True,
                                                 capturable=True)
            self.name = "adamw-fused-capturable"
        else:
            self.torch_adamw = torch.optim.AdamW(param_groups, lr=lr, betas=betas, eps=eps)
            self.name = "adamw-default"

    def backward(self, loss: torch.Tensor, grad_clip: float | None) -> None:
        """Backward of ``loss`` (scaled under fp16), then the gradients unscaled and clipped like
        ``torch.nn.utils.clip_grad_norm_`` on the flat buffer, with no host sync."""
        if self.loss_scale is not None:
            # Scaled backward; unscale and clip become one multiplier inside the AdamW kernel.
            self._backward(self.loss_scale.scale_loss(loss))
            self.loss_scale.unscale_factor_(self.flat_grad, grad_clip)
            return
        if self.scaler is not None:
            self._backward(self.scaler.scale(loss))
            self.scaler.unscale_(self.torch_adamw)  # the grads are views of flat_grad: unscaled in place
        else:
            self._backward(loss)
        if grad_clip is not None:  # clip_grad_norm_'s formula on the flat buffer
            norm = torch.linalg.vector_norm(self.flat_grad)
            self.flat_grad.mul_(torch.clamp(grad_clip / (norm + 1e-6), max=1.0))

    def _backward(self, loss: torch.Tensor) -> None:
        loss.backward()
        if self.join_backward is not None:
            self.join_backward()

    @torch.no_grad()
    def step(self) -> None:
        if self.torch_adamw is not None:
            if self.scaler is not None:
                self.scaler.step(self.torch_adamw)  # skips on inf/nan (fused: on the device)
                self.scaler.update()
            else:
                self.torch_adamw.step()
            return
        from kernels.adamw import adamw_step_

        ls = self.loss_scale
        # Its own launch: incrementing inside the kernel would race with its readers. A step the
        # loss scaler skips leaves the count where it was, as torch's GradScaler does.
        self.step_t += 1 if ls is None else ls.step_increment()
        k = self.skip
        adamw_step_(self.flat_param[k:], self.flat_grad[k:], self.exp_avg, self.exp_avg_sq, self.step_t, self.lr_t,
                    betas=self.betas, eps=self.eps, weight_decay=self.weight_decay, n_decay=self.n_decay - k,
                    grad_scaling=None if ls is None else (ls.grad_mul, ls.found_inf))
        if ls is not None:
            ls.update_()

    @torch.no_grad()
    def reset_(self) -> None:
        """Back to a fresh optimizer (zero moments, step 0) and loss scale, in place so that captured
        pointers stay valid."""
        if self.loss_scale is not None:
            self.loss_scale.reset_()
        if self.scaler is not None:
            self.scaler.load_state_dict(self._scaler_state0)  # fills its scale and tracker in place
        if self.torch_adamw is None:
            self.exp_avg.zero_()
            self.exp_avg_sq.zero_()
            self.step_t.zero_()
            return
        for state in self.torch_adamw.state.values():
            for v in state.values():
                if torch.is_tensor(v):
                    v.zero_()  # step, exp_avg, exp_avg_sq

    def set_lr(self, lr: float, captured: bool) -> None:
        """Change the learning rate; a captured graph reads it (a device tensor) on its next replay."""
        if self.torch_adamw is None:
            self.lr_t.fill_(lr)
            return
        for g in self.torch_adamw.param_groups:
            if torch.is_tensor(g["lr"]):  # CUDA: filled in place, where the captured step reads it
                g["lr"].fill_(lr)
            elif captured:  # a float lr was baked into the graph at capture
                raise RuntimeError("set_lr after capture needs a device-tensor lr (the adamw kernel's, or "
                                   "torch's fused AdamW on CUDA)")
            else:
                g["lr"] = lr

    def loss_scale_state(self) -> dict[str, Any] | None:
        """fp16: the loss scaler's scale and clean-step count now (host values: syncs); else None."""
        if self.loss_scale is not None:
            return {"scaler": "device (flat AdamW skips)", **self.loss_scale.state()}
        if self.scaler is not None:
            st = self.scaler.state_dict()
            return {"scaler": "torch.amp.GradScaler", "scale": st["scale"], "growth_tracker": st["_growth_tracker"]}
        return None

    def loss_scale_kind(self) -> str | None:
        return "device" if self.loss_scale is not None else "torch.amp.GradScaler" if self.scaler is not None else None


class FlatMuon:
    """Muon on the block matrices at the front of the flat buffer (``ftlib.training.muon``): views of
    the parameters and gradients, momentum buffers at fixed addresses, and the learning rate as a
    device scalar, so a captured step replays it with the rate of the current step. ``grouped``: the
    matrices of each shape updated together (``muon_update_grouped_``), else one at a time."""

    def __init__(self, params: list[nn.Parameter], lr: float, momentum: float = 0.95,
                 weight_decay: float = 0.0, grouped: bool = False) -> None:
        self.params, self.grouped = params, grouped
        self.bufs = [torch.zeros_like(p) for p in params]
        self.lr_t = torch.tensor(lr, dtype=torch.float32, device=params[0].device)
        self.momentum, self.weight_decay = momentum, weight_decay

    @torch.no_grad()
    def step(self) -> None:
        from ftlib.training.muon import muon_update_, muon_update_grouped_

        update = muon_update_grouped_ if self.grouped else muon_update_
        update(self.params, [p.grad for p in self.params], self.bufs, self.lr_t,
               weight_decay=self.weight_decay, momentum=self.momentum)

    @torch.no_grad()
    def reset_(self) -> None:
        for b in self.bufs:
            b.zero_()

    def set_lr(self, lr: float) -> None:
        self.lr_t.fill_(lr)
