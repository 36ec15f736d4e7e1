"""The engine: the whole training step on kernels and flat buffers, captured in one CUDA graph.

``Engine(config, B, T, precision, device, **options)`` owns a model of ``config`` and trains it
with ``engine.step(x, y) -> loss``. Against ``ftlib.training.step.train_step`` with
``torch.optim.AdamW`` (same math, same initial weights) it changes how the step is executed, not
what it computes:

1. Kernels: where one in ``kernels/`` applies, the model's module is swapped for it
   (:mod:`ftlib.training.engine.swaps`); each can be switched off (:class:`EngineOptions`).
2. Flat buffers: parameters and gradients are views into two fp32 buffers, so AdamW is one
   kernel and zero_grad one memset (:mod:`ftlib.training.engine.flat`).
3. Static shapes, one graph: inputs live in static (B, T) buffers; on CUDA the whole step (memset,
   forward, loss, backward, AdamW) is captured once in a ``torch.cuda.CUDAGraph`` and replayed,
   so no gaps open between the step's kernels while Python queues the next one. The capture
   follows PyTorch's whole-network capture recipe (CUDA semantics notes): warm up on a side stream
   first (Triton compiles and loads its kernels, cuBLAS creates workspaces, the optimizer its
   state: none of that may happen during capture), then capture, on that same stream (the capture's
   comment says why). Unlike the recipe, the warm-up
   steps are undone (weights and optimizer state restored, one copy each thanks to the flat
   buffers), so step k of the engine is step k of reference training. On the CPU the same step
   runs uncaptured (kernels in Triton's interpreter), which is how CI tests it.

Precision: the TF32 flags and autocast are set only while the step is warmed up, captured or
(uncaptured) run, and restored after, so the engine changes no global setting; a replay needs no
flags. A precision the device cannot run as labelled is refused (bf16 and tf32 on a T4), and the
Triton matmuls go in only where ``tl.dot`` gets tensor cores (:class:`ftlib.core.device.DeviceInfo`,
detected, passed as ``device_info``, or rehearsed through ``FTLIB_CAPABILITY``).

Importing this module imports neither Triton nor ``kernels``' op modules: they are imported
when an engine that uses them is built.
"""

from __future__ import annotations

from typing import Any

import torch

from ftlib.core.device import DeviceInfo, pick_device
from ftlib.model.config import ModelConfig, preset
from ftlib.model.gpt import build_model
from ftlib.training.engine.atomics import relaxed_atomics_note
from ftlib.training.engine.attention import FusedExplicitSelfAttention, qkv_biases_into_attention
from ftlib.training.engine.embedding import FusedEmbeddingSum
from ftlib.training.engine.flat import FlatMuon, FlatOptimizer, flatten_parameters_
from ftlib.training.engine.fused_mlp import fc_biases_into_gelu, fuse_mlps
from ftlib.training.engine.grad_into import bias_sum_why_not
from ftlib.training.engine.head_loss import fuse_head_loss, loss_function
from ftlib.training.engine.launches import programmatic_launch_applies, step_launches
from ftlib.training.engine.linears import setup_linears, triton_gemm_why_not
from ftlib.training.engine.norms import FirstNormInto, FusedAddNorm, fuse_residual_dropout_, norms_after_adds
from ftlib.training.engine.options import KERNEL_OPS, EngineOptions, StepPrecision
from ftlib.training.engine.swaps import kernels_runnable, swap_kernels
from ftlib.training.loss_scale import LossScaleConfig
from ftlib.training.muon import is_muon_param

# Side-stream steps before capture; PyTorch's whole-network example uses 3.
WARMUP_STEPS = 3


class Engine:
    """One model, its flat buffers and optimizer state, and (on CUDA) its captured step.

    ``options``: an :class:`EngineOptions`, a mapping, or the options as keywords. The optimizer is
    AdamW with ``lr, betas, eps, weight_decay`` on the 'matrices' groups of
    ``ftlib.training.step.param_groups`` (decay parameters with >= 2 dims only); ``grad_clip``
    clips the global gradient norm like ``torch.nn.utils.clip_grad_norm_`` (None: no clipping);
    ``loss_scale`` (fp16 only) sets the dynamic loss scaling's knobs. ``seed`` gives the initial
    weights of ``build_model(config, seed)``, the reference's.

    Attributes: ``model``, ``flat_param`` / ``flat_grad`` (N,), ``n_decay`` (elements [0, n_decay)
    are decayed), ``spans`` (name -> (offset, numel)), ``kernels`` (op -> a kernel took it over),
    ``notes`` (what stayed on PyTorch and why), ``optimizer``, ``captured``, ``static_x`` /
    ``static_y`` (B, T), ``grad_into`` (how many Linear weights write their gradient into ``flat_grad``),
    ``linears`` (what :func:`ftlib.training.engine.linears.setup_linears` did to the Linear layers).
    """

    def __init__(
        self,
        config: ModelConfig | str,
        B: int,
        T: int,
        precision: str = "fp32",
        device: torch.device | str = "auto",
        options: EngineOptions | dict[str, Any] | None = None,
        *,
        lr: float = 3e-4,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        seed: int | None = 0,
        warmup_steps: int = WARMUP_STEPS,
        grad_clip: float | None = None,
        loss_scale: LossScaleConfig | None = None,
        device_info: DeviceInfo | None = None,
        muon_lr: float | None = None,
        muon_momentum: float = 0.95,
        **option_values: Any,
    ) -> None:
        cfg = preset(config) if isinstance(config, str) else config
        cfg.check_sequence(T)
        self.options = EngineOptions.of(options, **option_values)
        self.prec = StepPrecision.of(precision, self.options)
        dev = pick_device(device) if isinstance(device, str) else torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        # No row under a precision label the device cannot run as labelled.
        self.device_info = device_info or DeviceInfo.detect(dev)
        if self.device_info.kind == "cuda" and (reason := self.device_info.why_not(precision)) is not None:
            raise ValueError(f"precision={precision!r} on {self.device_info.label()}: {reason}")
        if loss_scale is not None and not self.prec.base.loss_scaling:
            raise ValueError(f"loss_scale is for precision='fp16' (dynamic loss scaling), got precision={precision!r}")
        if grad_clip is not None and not grad_clip > 0:
            raise ValueError(f"grad_clip={grad_clip} must be positive (or None for no clipping)")
        self.capture = dev.type == "cuda" if self.options.capture is None else self.options.capture
        if self.capture and dev.type != "cuda":
            raise ValueError(f"capture=True needs a CUDA device, got {dev}")
        self.config, self.B, self.T, self.precision, self.device = cfg, int(B), int(T), precision, dev
        self.grad_clip = grad_clip
        self.requested = self.options.kernels()

        # Same initial weights as build_model(cfg, seed) - the reference's - then the kernels in.
        self.model = build_model(cfg, seed=seed).to(dev)
        self.model.train()
        swaps = swap_kernels(self.model, self.options, self.prec, self.device_info, dev)
        self.kernels, self.notes = swaps.applied, swaps.notes
        self.resid_dropout = self._fuse_residual_norm(seed)
        self.qkv_biases = qkv_biases_into_attention(self.model, self.options, self.notes)  # their Linears sum none
        self.fc_biases = fc_biases_into_gelu(self.model, self.options, self.notes)  # the same
        self._loss_fn = loss_function(self.kernels["cross_entropy"], dev)
        self.pdl = programmatic_launch_applies(self.options, self.kernels, self.device_info, self.notes)

        # Flat buffers, decayed parameters first (ftlib.training.step.param_groups 'matrices'); with
        # Muon its block matrices lead, so that AdamW's range [n_muon, N) is one contiguous slice.
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        muon = [(n, p) for n, p in named if muon_lr is not None and is_muon_param(n, p)]
        muon_names = {n for n, _ in muon}
        decay = [(n, p) for n, p in named if p.dim() >= 2 and n not in muon_names]
        no_decay = [(n, p) for n, p in named if p.dim() < 2]
        ordered = muon + decay + no_decay
        self.flat_param, self.flat_grad, spans = flatten_parameters_([p for _, p in ordered])
        self.spans = {n: s for (n, _), s in zip(ordered, spans)}
        self.n_decay = sum(p.numel() for _, p in muon + decay)
        n_muon = sum(p.numel() for _, p in muon)
        self.optimizer = FlatOptimizer(
            self.flat_param, self.flat_grad, self.n_decay, ([p for _, p in decay], [p for _, p in no_decay]),
            kernel=self.kernels["adamw"], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
            loss_scaling=self.prec.base.loss_scaling, loss_scale_config=loss_scale or LossScaleConfig(),
            precision=precision, skip=n_muon)
        self.muon = FlatMuon([p for _, p in muon], muon_lr, muon_momentum,
                             grouped=self.options.muon_grouped) if muon else None
        # The Linears onto the bf16 shadow and into the flat gradient (linears.py).
        self.linears = setup_linears(self.model, self.options, self.prec, self.flat_param, self.flat_grad,
                                     self.spans, self.n_decay, self.bias_elsewhere | self.qkv_biases | self.fc_biases)
        self.flat_param16, self.grad_into = self.linears.shadow16, self.linears.grad_into
        if self.linears.wgrad_stream is not None:  # its weight gradients joined before anything reads them
            self.optimizer.join_backward = self.linears.wgrad_stream.join
        self.notes.update(self.linears.notes)
        self.fused_mlps = 0
        if self.options.fuse_mlp_act:  # last: it reads the Linears' bf16 shadows and gradient views
            self.fused_mlps, self.notes["fuse_mlp_act"] = fuse_mlps(
                self.model, self.prec.base.autocast is not None, self.prec.base.tf32,
                triton_gemm_why_not(dev, self.prec))
        self.head_loss = None  # the same: it reads the head's bf16 shadow and gradient view
        if self.options.fuse_head_loss:
            self.head_loss, self.notes["fuse_head_loss"] = fuse_head_loss(
                self.model, self.kernels["cross_entropy"], triton_gemm_why_not(dev, self.prec),
                "tf32" if self.prec.base.tf32 else "ieee", check_targets=dev.type != "cuda",
                sem=self.options.atomic_sem, low_precision=self.prec.base.autocast is not None)
            self._loss_fn = self._loss_fn if self.head_loss is None else self.head_loss.loss
        if self.options.relaxed_atomics:
            self.notes["relaxed_atomics"] = relaxed_atomics_note(self.model, self.linears.wgrad_splitk)

        self.static_x = torch.zeros(self.B, self.T, dtype=torch.long, device=dev)  # (B, T) tokens
        self.static_y = torch.zeros(self.B, self.T, dtype=torch.long, device=dev)  # (B, T) targets
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_loss: torch.Tensor | None = None
        self.captured = False
        if self.capture:
            self._warm_up_and_capture(warmup_steps)

    # -- what the options make of this model -------------------------------------------------

    def _fuse_residual_norm(self, seed: int | None) -> tuple[float, torch.Tensor, bool] | None:
        """Put the fused residual-add + norm kernel in the model's ``add_norm`` seam where asked for and
        possible, with the branches' dropout inside it; returns that dropout (p, seed tensor, rng4) or None."""
        o, cfg = self.options, self.config
        self.fuse_residual_norm = False
        if o.fuse_residual_norm:
            why_not = kernels_runnable(self.device)
            if why_not:
                self.notes["residual_norm"] = why_not
            elif not self.kernels[cfg.norm]:
                self.notes["residual_norm"] = f"off: the {cfg.norm} kernel is switched off"
            else:
                self.fuse_residual_norm = True
                self.notes["residual_norm"] = f"residual add fused into the next {cfg.norm} (kernels/residual_norm.py)"
        # bf16 only, with the fused norms: their outputs feed Linears that autocast casts to bf16.
        norm_out = self.prec.low_dtype if (o.bf16_norm_out and self.fuse_residual_norm) else None
        if o.bf16_norm_out and norm_out is None:
            self.notes["bf16_norm_out"] = "not applied: needs precision='bf16' and the fused residual-norm"
        self.norm_out_dtype = norm_out
        dropout = None
        if o.fuse_dropout and cfg.dropout > 0:
            if not self.fuse_residual_norm:
                self.notes["fuse_dropout"] = "not applied: needs the fused residual-norm"
            else:
                # The mask is drawn from a seed tensor that every step increments (also on graph replay).
                gen = torch.Generator().manual_seed(0 if seed is None else seed)
                start = torch.randint(0, 2**40, (1,), generator=gen, dtype=torch.int64)
                dropout = (fuse_residual_dropout_(self.model), start.to(self.device), bool(o.dropout_rng4))
                self.notes["fuse_dropout"] = (f"residual dropout p={cfg.dropout} inside the fused residual-norm "
                                              "(mask from Philox, redrawn in the backward)")
        branch_biases = self._branch_biases(dropout)
        self.bias_elsewhere = frozenset(id(b) for b in branch_biases.values())  # for setup_linears
        if self.fuse_residual_norm:
            self.model.add_norm = FusedAddNorm(self.model, norm_out, dropout, o.norm_dw_partials,
                                               dw_into=o.norm_dw_into_buffer, bwd_grid=o.norm_bwd_grid,
                                               branch_biases=branch_biases, sem=o.atomic_sem)
        if o.first_norm_into_buffer:  # the one norm no residual add precedes, onto the same backward kernel
            first = self.model.blocks[0] if len(self.model.blocks) else None
            if not (self.fuse_residual_norm and o.norm_dw_into_buffer and first is not None):
                self.notes["first_norm_into_buffer"] = ("not applied: needs the fused residual-norm with "
                                                        "norm_dw_into_buffer")
            else:
                first.norm1 = FirstNormInto(first.norm1, cfg.norm == "layernorm", o.norm_bwd_grid, o.atomic_sem)
                self.notes["first_norm_into_buffer"] = "the first norm's backward on the fused residual-norm kernel"
        return dropout

    def _branch_biases(self, dropout: tuple | None) -> dict[int, torch.nn.Parameter]:
        """With ``branch_bias_into_norm`` where it applies: {id(norm): the bias of the output projection whose
        result that norm's residual add takes}; else {}, with a note saying why."""
        o, cfg = self.options, self.config
        if not o.branch_bias_into_norm:
            return {}
        why = ("not applicable: the config has no biases" if not cfg.bias
               else "not applied: needs the fused residual-norm with norm_dw_into_buffer"
               if not (self.fuse_residual_norm and o.norm_dw_into_buffer)
               else bias_sum_why_not(o, self.notes)
               or ("not applied: fuse_mlp_act computes its projection's bias gradient itself" if o.fuse_mlp_act
                   else "not applied: a dropout module sits between each projection and its add (fuse_dropout off)"
                   if cfg.dropout > 0 and dropout is None else None))
        if why:
            self.notes["branch_bias_into_norm"] = why
            return {}
        out = {}
        for blk, after_attn, after_mlp in norms_after_adds(self.model):
            out[id(after_attn)], out[id(after_mlp)] = blk.attn.proj.bias, blk.mlp.proj.bias
        self.notes["branch_bias_into_norm"] = f"{len(out)} projection biases' gradients added by the norm backwards"
        return out

    # -- the step ----------------------------------------------------------------------------

    def _step_body(self) -> torch.Tensor:
        """zero grad (one memset) + forward + loss + backward + AdamW, on the static buffers."""
        with step_launches(self.pdl, self.options.programmatic_trigger):  # backward's too (programmatic_launch)
            self.flat_grad.zero_()
            if self.flat_param16 is not None:  # the step's bf16 weights (and biases), one copy
                self.flat_param16.copy_(self.flat_param[: self.flat_param16.numel()])
            if self.resid_dropout is not None:  # a new mask every step, also on graph replay
                self.resid_dropout[1].add_(1)
            logits, _ = self.model(self.static_x)  # (B, T, V); with fuse_head_loss the head's input h, (B, T, C)
            # (B, T, V) -> (B*T, V) logits (or h -> (B*T, C): the fused loss forms them), (B, T) -> (B*T,) targets
            loss = self._loss_fn(logits.view(self.B * self.T, -1), self.static_y.view(self.B * self.T))
            self.optimizer.backward(loss, self.grad_clip)
            self.optimizer.step()
            if self.muon is not None:
                self.muon.step()
        return loss.detach()

    def _warm_up(self, steps: int) -> None:
        """Run ``steps`` real steps (kernels compile and load, the optimizer creates its state), then
        undo them, so that engine step 0 starts from the initial weights like the reference."""
        saved = self.flat_param.clone()  # one copy: the flat buffer holds every weight
        for _ in range(steps):
            self._step_body()
        with torch.no_grad():
            self.flat_param.copy_(saved)
        self.optimizer.reset_()
        if self.muon is not None:
            self.muon.reset_()

    def _warm_up_and_capture(self, warmup_steps: int) -> None:
        """PyTorch's whole-network capture: side-stream warm-up, then one graph of the step."""
        with self.prec.base.region(self.device):
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self._warm_up(max(1, warmup_steps))
            torch.cuda.current_stream(self.device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            # Only recorded; activations come from the graph's private pool, reused by every replay. On
            # the warm-up's stream: autograd keeps each parameter's AccumulateGrad node and its stream
            # from the warm-up (pytorch/pytorch#137483) and ends a backward waiting on those streams;
            # with every gradient added out of band (autograd gets None) none moves onto the capture
            # stream, and the wait breaks the capture (pytorch/pytorch#189591). One stream: no wait.
            with torch.cuda.graph(self.graph, stream=side):
                self.static_loss = self._step_body()
        self.captured = True

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One training step on tokens x and targets y (B, T); returns the loss (0-dim, detached).

        On CUDA the returned tensor is the graph's static output: the next step overwrites it, so
        take ``.item()`` or ``.clone()`` before then. No host sync happens here. Passing
        ``static_x`` / ``static_y`` themselves (after filling them) skips the copies.
        """
        if tuple(x.shape) != (self.B, self.T) or tuple(y.shape) != (self.B, self.T):
            raise ValueError(f"x and y must be ({self.B}, {self.T}); got {tuple(x.shape)}, {tuple(y.shape)}")
        if x is not self.static_x:
            self.static_x.copy_(x)
        if y is not self.static_y:
            self.static_y.copy_(y)
        if self.captured:
            self.graph.replay()
            return self.static_loss
        with self.prec.base.region(self.device):
            return self._step_body()

    def set_lr(self, lr: float, muon_lr: float | None = None) -> None:
        """Change the learning rates (AdamW's, and Muon's where it runs); a captured graph reads the
        new values on its next replay."""
        self.optimizer.set_lr(lr, self.captured)
        if muon_lr is not None:
            if self.muon is None:
                raise ValueError("muon_lr given, but this engine runs AdamW only (Engine(..., muon_lr=...))")
            self.muon.set_lr(muon_lr)

    def num_params(self) -> int:
        return self.flat_param.numel()

    def loss_scale_state(self) -> dict[str, Any] | None:
        """fp16: the loss scaler's scale and clean-step count now (host values: syncs); else None."""
        return self.optimizer.loss_scale_state()

    def describe(self) -> dict[str, Any]:
        """What this engine runs, for result rows and the book."""
        o = self.options
        dw_into = bool(o.norm_dw_into_buffer and self.fuse_residual_norm)  # atomic adds in the fused norm
        attn = self.model.blocks[0].attn if len(self.model.blocks) else None  # every block's is swapped alike
        return {
            "kernels": [op for op in KERNEL_OPS if self.kernels[op]],
            "requested_off": [op for op in KERNEL_OPS if not self.requested[op]],
            "notes": dict(self.notes),
            "captured": self.captured,
            "optimizer": self.optimizer.name if self.muon is None else f"muon + {self.optimizer.name}",
            "n_params": self.num_params(),
            "n_decay": self.n_decay,
            "grad_clip": self.grad_clip,
            # Each option as applied (None or False where it did not apply).
            "linear_precision": o.linear_precision if self.notes.get("linear", "").startswith("Triton") else None,
            "attention_precision": o.attention_precision,
            "attention_layout": o.attention_layout if self.kernels["attention"] else None,
            # The flash kernels' tiles, or GPT-2's explicit-attention kernels' where those take its attention.
            "attention_tiles": (o.attention_tiles if self.kernels["attention"]
                                or isinstance(attn, FusedExplicitSelfAttention) else None),
            "attention_kv_split": getattr(attn, "kv_split", None),  # the flash kernel's module, where it applied
            "attention_bwd_streams": bool(getattr(attn, "concurrent_bwd", False) and o.attention_layout == "packed"),
            "attention_pack_heads": getattr(attn, "pack_heads", 1) > 1,
            "attention_heavy_first": bool(getattr(attn, "heavy_first", False)),
            "fuse_residual_norm": self.fuse_residual_norm,
            "fuse_dropout": self.resid_dropout is not None,
            "bias_kernel": self.notes.get("bias", "").startswith("bias gradients"),
            "bf16_norm_out": self.norm_out_dtype is not None,
            "bf16_weights": self.flat_param16 is not None,
            "fused_softmax": self.notes.get("softmax", "").startswith("scale"),
            "fuse_softmax_matmuls": isinstance(attn, FusedExplicitSelfAttention),
            # GPT-2's explicit-attention kernels over whole rows, where the swap applied them.
            "explicit_one_pass": bool(isinstance(attn, FusedExplicitSelfAttention) and attn.core.fwd_one_pass),
            "explicit_dq_one_pass": bool(isinstance(attn, FusedExplicitSelfAttention) and o.explicit_dq_one_pass
                                         and attn.core.dq_one_pass),
            "programmatic_launch": self.pdl,
            "explicit_heavy_first": bool(isinstance(attn, FusedExplicitSelfAttention) and attn.core.heavy_first),
            "grad_into_buffer": self.grad_into > 0,
            # Where an RMSNorm or fused residual-norm backward runs (the LayerNorm kernel's is always persistent).
            "norm_dw_partials": o.norm_dw_partials if self.fuse_residual_norm or self.kernels["rmsnorm"] else None,
            # Only where the dK/dV kernel is split: the attention kernel on, several query heads per K/V head.
            "fuse_kv_split_sum": (o.fuse_kv_split_sum and self.kernels["attention"]
                                  and self.config.n_head > self.config.n_kv_head),
            "muon_grouped": self.muon is not None and self.muon.grouped,
            "norm_dw_into_buffer": dw_into,
            "branch_bias_into_norm": bool(self.bias_elsewhere),
            "qkv_bias_into_attention": bool(self.qkv_biases),
            "fc_bias_into_gelu": bool(self.fc_biases),
            "first_norm_into_buffer": len(self.model.blocks) > 0 and isinstance(self.model.blocks[0].norm1,
                                                                               FirstNormInto),
            "fuse_mlp_act": self.fused_mlps > 0,
            "fuse_head_loss": self.head_loss is not None,
            "fuse_embedding": isinstance(self.model.embedding_sum, FusedEmbeddingSum),
            "relaxed_atomics": not self.notes.get("relaxed_atomics", "not").startswith("not"),
            "wgrad_splitk": self.linears.wgrad_splitk,
            "wgrad_side_stream": self.linears.wgrad_stream is not None,
            "bias_into_buffer": self.linears.bias_into_buffer,
            "bf16_bias_weights": self.linears.bf16_bias_weights,
            "norm_bwd_grid": o.norm_bwd_grid if dw_into else None,  # the grid of those atomic adds
            "loss_scale": self.optimizer.loss_scale_kind(),
            "device_info": self.device_info.label() + (" (rehearsal)" if self.device_info.rehearsal else ""),
        }
