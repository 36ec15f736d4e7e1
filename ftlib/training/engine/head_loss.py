"""The output head and the loss in two kernels (``kernels/linear_cross_entropy.py``; engine option ``fuse_head_loss``).

``GPT.forward`` ends with logits = head(h), and the engine takes the cross-entropy of those logits: a GEMM and the
loss kernel forward, two GEMMs backward (dx and dW), with the (B*T, V) logits and their gradient written and read
between them. With the option the engine's head passes h through unchanged in the training step
(:class:`HeadIntoLoss`), and the engine's loss function multiplies h by the head's weight inside the fused kernels,
which keep each block of rows' logits in registers. Everything else the engine did to the head stays: the products
read its bf16 shadow weight (``bf16_weights``) and dW is added into its view of the flat fp32 gradient, which the
engine zeroes at the start of the step (``grad_into_buffer``). A tied head (GPT-2's) adds its part there before
the embedding's backward adds the other, as the unfused head does. Outside the training step (evaluation,
sampling) the head is the ordinary Linear and returns logits.

Applied under bf16 / fp16 autocast where a Triton GEMM may run
(:func:`ftlib.training.engine.linears.triton_gemm_why_not`), to a head without a bias or a logit soft-cap (the
kernels compute neither), for vocabularies whose row of logits fits one register tile. The kernels take fp32
operands too (tf32 products), but in tf32 the option's trial was mixed, so the engine does not apply it there.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from ftlib.model.gpt import GPT
from ftlib.training.engine.grad_into import GradIntoLinear


def loss_function(cross_entropy_kernel: bool, device: torch.device) -> Callable[..., torch.Tensor]:
    """The engine's loss of (B*T, V) logits and (B*T,) targets: the cross-entropy kernel, or ``F.cross_entropy``
    (exactly what ``GPT.forward`` computes) where that kernel is off."""
    if not cross_entropy_kernel:
        return F.cross_entropy
    from kernels.cross_entropy import cross_entropy

    # The kernel's target check is a host sync per call, which an uncaptured CUDA step must not have (step()
    # queues ahead of the device). The targets are the engine's own static buffer, filled from the data
    # loader's tokens, so they are in range.
    return partial(cross_entropy, check_targets=device.type != "cuda")


class HeadIntoLoss(nn.Module):
    """Takes over the engine's head (a :class:`GradIntoLinear`: the same Parameter, so names do not change).
    In the training step its forward returns h and :meth:`loss` computes the cross-entropy of h W^T."""

    def __init__(self, head: GradIntoLinear, input_precision: str, check_targets: bool, sem: str = "acq_rel") -> None:
        super().__init__()
        self.weight = head.weight
        self.in_features, self.out_features = head.in_features, head.out_features
        # Plain attributes, not buffers: views into the engine's bf16 shadow and flat gradient.
        self.w16, self.grad = head.w16, head.grad
        self.input_precision = input_precision  # the products of fp32 operands (tf32 steps)
        self.check_targets = check_targets  # a host sync: only where the step is not queued ahead (the CPU)
        self.sem = sem  # the memory order of the backward's atomic adds into dW (option relaxed_atomics)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            return h  # (B, T, C): the logits are formed inside loss()
        return F.linear(h, self.weight)

    def loss(self, h2: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the logits h2 W^T for h2 (B*T, C) and targets (B*T,)."""
        from kernels.cross_entropy import check_targets_in_range
        from kernels.linear_cross_entropy import linear_cross_entropy

        if self.check_targets:
            check_targets_in_range(targets, self.out_features, -100)
        dev = h2.device.type
        wc = self.weight
        if torch.is_autocast_enabled(dev):  # autocast's casts for the head's F.linear, made here
            low = torch.get_autocast_dtype(dev)
            h2 = h2.to(low)  # a no-op where the final norm already wrote bf16
            wc = self.w16 if self.w16 is not None else self.weight.to(low)
        return linear_cross_entropy(h2, self.weight, targets, w_compute=wc, dw_out=self.grad,
                                    input_precision=self.input_precision, sem=self.sem)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, logits formed in the loss "
                "kernels, dW into the flat gradient" + (", bf16 shadow" if self.w16 is not None else ""))


def fuse_head_loss(model: GPT, cross_entropy_kernel: bool, gemm_why_not: str | None, input_precision: str,
                   check_targets: bool, sem: str = "acq_rel",
                   low_precision: bool = True) -> tuple[HeadIntoLoss | None, str]:
    """Swaps ``model.head`` for a :class:`HeadIntoLoss` where the fused kernels can take it; returns it (None where
    they cannot, or where the step is not under bf16/fp16 autocast, ``low_precision``) and the note that says what
    happened. ``gemm_why_not``: ``triton_gemm_why_not``'s answer; ``sem``: the memory order of the backward's
    atomic adds. The kernels run fp32 operands too (``input_precision``), but in tf32 their trial was mixed."""
    head, cfg = getattr(model, "head", None), model.config
    why = (gemm_why_not
           or (None if low_precision else "not applied: bf16 and fp16 only (in tf32 its trial was mixed: chapter 6)")
           or (None if cross_entropy_kernel else "not applied: needs the cross-entropy kernel")
           or (None if isinstance(head, GradIntoLinear) else "not applied: needs the head on grad_into_buffer")
           or (None if head.bias is None else "not applied: the head has a bias")
           or (None if cfg.logit_softcap is None else "not applied: the kernels compute no logit soft-cap"))
    if why is not None:
        return None, why
    # Imported only where the kernels can run: importing it builds its @triton.jit functions, compiled or
    # interpreted by TRITON_INTERPRET as it is now, for the rest of the process.
    from kernels.linear_cross_entropy import MAX_V

    if head.out_features > MAX_V:
        return None, f"not applied: a vocabulary above {MAX_V}"
    model.head = HeadIntoLoss(head, input_precision, check_targets, sem)
    return model.head, f"head GEMM, cross-entropy and the head's backward GEMMs as two kernels (V={cfg.vocab_size})"
