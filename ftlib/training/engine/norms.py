"""The residual adds and the norms after them on the fused kernels, each way (:mod:`kernels.residual_norm`,
:mod:`kernels.norm_into`): the modules the engine puts in the model's ``add_norm`` seam
(``ftlib.model.block.AddNorm``) and in place of the first block's first norm, the one norm no residual add
precedes. Their backwards can add the norms' weight (and bias) gradients straight into the flat gradient's
views with atomic adds (options ``norm_dw_into_buffer``, ``first_norm_into_buffer``), on the grid
``norm_bwd_grid`` names, in the memory order ``relaxed_atomics`` picks, and take the branches' residual
dropout inside the kernel (``fuse_dropout``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from ftlib.model.gpt import GPT
from ftlib.training.engine.grad_into import grad_views

if TYPE_CHECKING:
    from kernels._common import RowGrid


def norms_after_adds(model: GPT) -> list[tuple[nn.Module, nn.Module, nn.Module]]:
    """Per block, in the forward's order: (the block, the norm its attention's residual add feeds (its norm2),
    the norm its MLP's add feeds (the next block's norm1, or the final norm)). Each norm follows exactly one add."""
    blocks = list(model.blocks)
    nexts = [blk.norm1 for blk in blocks[1:]] + [model.norm_f]
    return [(blk, blk.norm2, nxt) for blk, nxt in zip(blocks, nexts)]


def _row_grid(text: str | None) -> RowGrid | None:
    """The backward grid ``text`` names ('<rows> rows <P>/SM'), parsed once at construction, not at every forward;
    None: the launcher's own."""
    if text is None:
        return None
    from kernels._common import RowGrid

    return RowGrid.parse(text)


class FusedAddNorm(nn.Module):
    """The model's ``add_norm`` on one kernel each way (:mod:`kernels.residual_norm`): the residual
    add and the RMSNorm or LayerNorm after it, the norm's output in ``out_dtype`` (bf16 under bf16
    autocast: what the next Linear would cast it to; None: the stream's dtype).

    ``dw_partials``: the backward's weight-gradient partials (:func:`kernels.residual_norm.add_norm_bwd`).
    ``dw_into``: instead, the backward adds each norm's weight (and bias) gradient into that parameter's
    ``.grad`` with atomic adds (``dw_partials="atomic"``) and hands autograd nothing to add: for the
    engine, whose ``.grad`` tensors are views of one flat buffer zeroed at the start of every step;
    ``bwd_grid`` ('<rows> rows <P>/SM', :class:`kernels._common.RowGrid`) the grid that backward runs on;
    ``branch_biases`` (with ``dw_into``): {id(norm): the bias of the projection whose output that norm's add
    takes}, whose gradient, the column sums of the branch's gradient, the same backward adds into its ``.grad``;
    ``sem``: the memory order of those atomic adds (:data:`kernels._common.ATOMIC_SEMS`).

    ``dropout`` = (p, seed tensor, rng4): each branch's residual dropout runs inside the kernel, for a
    model whose branch dropout modules are identities (:func:`fuse_residual_dropout_`). Call site k
    of the forward (k = 1, 2, ... in the order of the adds) draws its mask with salt k; the salt is
    looked up by the norm that follows the add, each norm following exactly one. In eval mode p is 0.
    """

    def __init__(self, model: GPT, out_dtype: torch.dtype | None,
                 dropout: tuple[float, torch.Tensor, bool] | None = None, dw_partials: str = "tile",
                 dw_into: bool = False, bwd_grid: str | None = None,
                 branch_biases: dict[int, nn.Parameter] | None = None, sem: str = "acq_rel") -> None:
        super().__init__()
        self.branch_biases = branch_biases or {}  # id(norm) -> the bias its add's branch added last
        self.bwd_grid, self.sem = _row_grid(bwd_grid), sem
        self.layernorm = model.config.norm == "layernorm"
        self.out_dtype, self.dropout, self.dw_partials, self.dw_into = out_dtype, dropout, dw_partials, dw_into
        order = [norm for _, after_attn, after_mlp in norms_after_adds(model) for norm in (after_attn, after_mlp)]
        self._salt = {id(norm): k for k, norm in enumerate(order, start=1)}

    def forward(self, x: torch.Tensor, branch: torch.Tensor, norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        from kernels.residual_norm import add_layer_norm, add_rms_norm

        p, seed, rng4 = self.dropout if (self.dropout is not None and self.training) else (0.0, None, False)
        kw = dict(p=p, seed=seed, salt=self._salt[id(norm)], rng4=rng4, dw_partials=self.dw_partials)
        bias = norm.bias if self.layernorm else None
        if self.dw_into and torch.is_grad_enabled():
            dw, db, drb = grad_views("dw_into", norm.weight, bias, self.branch_biases.get(id(norm)))
            kw.update(dw_partials="atomic", dw_out=dw, sem=self.sem)
            if self.bwd_grid is not None:
                launch = self.bwd_grid.launch(x.device)
                kw.update(bwd_rows=launch["rows"], programs=launch["programs"], loop_stages=launch["loop_stages"])
            if self.layernorm:
                kw["db_out"] = db
            if drb is not None:
                kw["drb_out"] = drb
        if self.layernorm:
            return add_layer_norm(x, branch, norm.weight, bias, norm.eps, self.out_dtype, **kw)
        return add_rms_norm(x, branch, norm.weight, norm.eps, self.out_dtype, **kw)


class FirstNormInto(nn.Module):
    """Takes over the first block's first norm (its Parameters, under the same names: ``weight``, and ``bias``
    for a LayerNorm): in training with gradients on, :func:`kernels.norm_into.norm_into`, the norm's backward on
    the fused residual-norm kernel with its weight (and bias) gradients added into their ``.grad`` (the engine's
    flat-gradient views, zeroed every step), on the grid ``bwd_grid`` names, in memory order ``sem``; elsewhere the
    norm's own kernel."""

    def __init__(self, norm: nn.Module, layer_norm: bool, bwd_grid: str | None = None, sem: str = "acq_rel") -> None:
        super().__init__()
        self.layer_norm, self.eps, self.weight = layer_norm, norm.eps, norm.weight
        if layer_norm:
            self.bias = norm.bias
        self.bwd_grid, self.sem = _row_grid(bwd_grid), sem

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.bias if self.layer_norm else None
        if not (self.training and torch.is_grad_enabled()):
            from kernels.layernorm import layer_norm
            from kernels.rmsnorm import rms_norm

            return layer_norm(x, self.weight, b, self.eps) if self.layer_norm else rms_norm(x, self.weight, self.eps)
        from kernels.norm_into import norm_into

        dw, db = grad_views("FirstNormInto", self.weight, b)
        grid = self.bwd_grid.launch(x.device) if self.bwd_grid is not None else {}
        return norm_into(x, self.weight, b, self.eps, self.layer_norm, dw, db, **grid, sem=self.sem)


def fuse_residual_dropout_(model: GPT) -> float:
    """Replace every block's branch dropout (attention's ``resid_dropout``, the MLP's ``dropout``) by an
    identity, in place; returns their p, which :class:`FusedAddNorm` then applies inside its kernels.
    The embedding dropout stays a module."""
    for blk in model.blocks:
        blk.attn.resid_dropout = nn.Identity()
        blk.mlp.dropout = nn.Identity()
    return model.config.dropout
