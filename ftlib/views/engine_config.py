"""Which engine a stored engine row ran, against the current defaults.

Options become defaults when they win their trial (suite ``engine_candidates``, chapter 6). Rows
measured before that ran another engine: this module names which defaults a row lacked, from the
engine's own ``describe()`` stored with it, so that the views never pool its ratios with the current
engine's (``ftlib.views.baselines``, chapter 6's notes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from ftlib.training.engine.fused_mlp import APPROXIMATE
from ftlib.training.engine.options import EngineOptions
from ftlib.training.engine.swaps import ATTN_HEAD_SIZES
from ftlib.views.bench import gpu_label

# Options that are defaults because they were faster beyond the spread in their trial (suite
# engine_candidates) and passed their 100-step check. Rows of an engine without them are another engine's:
# their ratios are never pooled with the current engine's.
TRIAL_WINNERS = ("grad_into_buffer", "fuse_kv_split_sum", "norm_dw_into_buffer", "norm_bwd_grid",
                 "fuse_softmax_matmuls", "bias_into_buffer", "bf16_bias_weights", "branch_bias_into_norm",
                 "first_norm_into_buffer", "explicit_dq_one_pass", "fc_bias_into_gelu", "wgrad_side_stream",
                 "attention_bwd_streams", "attention_kv_split", "fuse_embedding",
                 "relaxed_atomics", "fuse_head_loss", "attention_heavy_first", "explicit_heavy_first")
TODAY = "the current defaults"


def options_off(row: dict[str, Any], names: Iterable[str] = TRIAL_WINNERS) -> list[str] | None:
    """The options of ``names`` that are on by default now but were off in an engine row's step; None where
    the row does not say (stored before the engine described itself). Each row's ``engine`` field is the
    engine's ``describe()``, which reports an option as applied, so an option the row's model cannot use
    (the split sum on multi-head attention) is not counted, and a row from before an option existed ran
    without it. An option the row's case set on purpose (an ablation's ``extra``) is not counted either."""
    ran = row.get("engine")
    if not isinstance(ran, dict):
        return None
    now = dataclasses.asdict(EngineOptions())  # a default that is True, or a named grid, against False/None
    return [n for n in names if n not in (row.get("extra") or {}) and now.get(n) not in (None, False)
            and ran.get(n) in (None, False) and _applies(n, row)]


def engine_config(row: dict[str, Any]) -> str:
    """Which engine an engine row ran, against the current defaults: ``TODAY``, 'without <options>', or
    'options not recorded'; '' for a row of another mode."""
    if row.get("mode") != "engine":
        return ""
    off = options_off(row)
    return "options not recorded" if off is None else "without " + ", ".join(off) if off else TODAY


def engine_words(config: str, named: bool = False) -> str:
    """An :func:`engine_config` value in words: 'the current engine', 'an engine whose options were not
    recorded', or an earlier engine's: with ``named``, for chapter 6, which defines each option, 'an earlier
    engine, without <options>'; else, for pages that do not, 'an earlier engine: N of today's default options
    off; chapter 6 names them' (its engine tables list them by name)."""
    if config == TODAY:
        return "the current engine"
    if not config.startswith("without "):
        return "an engine whose options were not recorded"
    if named:
        return f"an earlier engine, {config}"
    n = len(config.removeprefix("without ").split(", "))
    return f"an earlier engine: {n} of today's default option{'s' * (n != 1)} off; chapter 6 names them"


def options_behind(engine_rows: Iterable[dict[str, Any]], run_ids: Iterable[str] | None = None,
                   names: Iterable[str] = TRIAL_WINNERS) -> str:
    """Where stored engine rows (of ``run_ids``, if given) ran with one of ``names`` off that is on by
    default now (:func:`options_off`): one line per device naming each option with its number of runs, whose
    ratios the engine tables keep apart from the current engine (:func:`engine_config`). Empty when none did."""
    wanted = None if run_ids is None else set(run_ids)
    seen: dict[tuple[str, str], set[str]] = {}
    for r in engine_rows:
        if r.get("mode") != "engine" or (wanted is not None and r.get("run_id") not in wanted):
            continue
        for name in options_off(r, names) or []:
            seen.setdefault((r["device_slug"], name), set()).add(str(r.get("run_id")))
    lines = []
    for dev in sorted({d for d, _ in seen}):
        each = [f"`{name}` in {len(ids)} run{'s' * (len(ids) != 1)}" for (d, name), ids in sorted(seen.items())
                if d == dev]
        lines.append(f"* On the {gpu_label(dev)}, engine rows of these runs ran with options off that are on by "
                     "default in the current engine (each one's trial is in the section on engine options below), so "
                     "those runs' ratios are an earlier engine's, on lines of their own: " + ", ".join(each) + ".")
    return "\n".join(lines)


# Options the current engine applies in some precisions only (ftlib.training.engine.options says why of each):
# a trial that timed them in others ran an engine from before they were narrowed.
PRECISIONS: dict[str, tuple[str, ...]] = {
    "wgrad_side_stream": ("bf16", "fp16"), "fuse_head_loss": ("bf16", "fp16"),
    "explicit_heavy_first": ("bf16", "fp16"), "bf16_bias_weights": ("bf16",)}


def _applies(name: str, row: dict[str, Any]) -> bool:
    """Whether option ``name`` could change ``row``'s step, by what its engine reported: not where the engine
    noted it as not applied or not applicable; the split sum needs multi-query attention on the attention
    kernel (strict fp32 keeps SDPA, which has no split to sum); the norms' atomic weight gradients need the
    fused residual-norm, their grid those adds. Where the row does not say which kernels ran, it applies."""
    ran = row.get("engine") if isinstance(row.get("engine"), dict) else {}
    if str((ran.get("notes") or {}).get(name, "")).startswith(("not applied", "not applicable")):
        return False
    if name == "fuse_kv_split_sum":
        cfg, kernels = row.get("config") or {}, ran.get("kernels")
        return (cfg.get("n_kv_head", cfg.get("n_head")) != cfg.get("n_head")
                and (kernels is None or "attention" in kernels))
    if name == "fuse_softmax_matmuls":  # it extends the fused softmax of explicit attention kept as written
        return _explicit_kernel_fits(row, ran)
    if name == "explicit_dq_one_pass":  # a tile of that kernel's dQ pass, over whole rows (swaps.py)
        return _dq_one_pass_fits(row, ran)
    if name == "wgrad_side_stream":  # CUDA, bf16/fp16, the Linears writing into the flat gradient (linears.py)
        return (row.get("precision") in PRECISIONS[name] and ran.get("grad_into_buffer") is not False
                and row.get("device_type", "cuda") == "cuda")
    if name == "attention_kv_split":  # the flash kernel's dK/dV split, where 2 divides the query heads per K/V head
        cfg = row.get("config") or {}
        group = int(cfg.get("n_head", 1)) // int(cfg.get("n_kv_head") or cfg.get("n_head", 1))
        return group % 2 == 0 and _applies("attention_bwd_streams", row)
    if name == "fuse_embedding":  # the embeddings on their kernel (not recorded: on)
        kernels = ran.get("kernels")
        return kernels is None or "embedding" in kernels
    if name == "fuse_head_loss":  # bf16/fp16, the cross-entropy kernel, the head on the flat gradient (head_loss.py)
        kernels = ran.get("kernels")
        return (row.get("precision") in PRECISIONS[name] and ran.get("grad_into_buffer") is not False
                and (kernels is None or "cross_entropy" in kernels))
    if name == "relaxed_atomics":  # a gradient kernel that adds atomically ran (engine/atomics.py)
        return (ran.get("norm_dw_into_buffer") is True and _needs_met("norm_dw_into_buffer", row, ran)
                or any(ran.get(n) is True for n in ("fuse_embedding", "fuse_head_loss", "wgrad_splitk")))
    if name == "attention_heavy_first":  # the flash kernel's grids, on the packed layout (as its two-stream backward)
        return _applies("attention_bwd_streams", row)
    if name == "explicit_heavy_first":  # GPT-2's explicit-attention kernels, under bf16/fp16 (swaps.py)
        return row.get("precision") in PRECISIONS[name] and _explicit_kernel_fits(row, ran)
    if name == "attention_bwd_streams":  # the flash kernel's backward, on the packed layout
        kernels = ran.get("kernels")
        if kernels is None:  # not recorded: where the flash kernel takes the attention (not GPT-2's as written)
            cfg, extra = row.get("config") or {}, row.get("extra") or {}
            return cfg.get("attn_impl", "sdpa") == "sdpa" or bool(extra.get("attention_for_explicit"))
        return "attention" in kernels and ran.get("attention_layout") in (None, "packed")
    if name in _NEEDS:
        return _needs_met(name, row, ran)
    return name != "norm_bwd_grid" or ran.get("norm_dw_into_buffer") is True  # the grid those adds run on


# What each option needs of a step (ftlib.training.engine.linears, engine, swaps): engine fields that must not
# have been off (a row from before a field existed ran with it unrecorded, which counts as on), and
# whether the config needs biases (the FastTransformer has none).
_NEEDS: dict[str, tuple[tuple[str, ...], bool]] = {
    "norm_dw_into_buffer": (("fuse_residual_norm",), False),  # the atomic adds live in its backward
    "bias_into_buffer": (("grad_into_buffer", "bias_kernel"), True),
    "bf16_bias_weights": (("grad_into_buffer", "bias_kernel", "bf16_weights"), True),
    "branch_bias_into_norm": (("grad_into_buffer", "bias_kernel", "fuse_residual_norm", "norm_dw_into_buffer"),
                              True),
    "first_norm_into_buffer": (("fuse_residual_norm", "norm_dw_into_buffer"), False),
    "fc_bias_into_gelu": (("grad_into_buffer", "bias_kernel"), True),
}


def _needs_met(name: str, row: dict[str, Any], ran: dict[str, Any]) -> bool:
    """Whether an option of :data:`_NEEDS` (the norms' and the biases' gradients into the flat gradient, the
    bf16 shadow) could have applied to ``row``'s step; the bf16
    shadow only under bf16, the branch biases not beside the GELU-epilogue GEMM (which sums its own) nor
    with an unfused dropout between each projection and its add."""
    fields, bias = _NEEDS[name]
    cfg = row.get("config") or {}
    if (bias and not cfg.get("bias")) or any(ran.get(f) is False for f in fields):
        return False
    if name == "bf16_bias_weights":
        return row.get("precision") in PRECISIONS[name]
    if name == "branch_bias_into_norm":
        return not ran.get("fuse_mlp_act") and not (cfg.get("dropout", 0.0) > 0 and ran.get("fuse_dropout") is False)
    if name == "fc_bias_into_gelu":  # GELU's backward does the sum; the GELU-epilogue GEMM sums its own
        return not ran.get("fuse_mlp_act") and cfg.get("activation", "gelu") in APPROXIMATE
    return True


def _dq_one_pass_fits(row: dict[str, Any], ran: dict[str, Any]) -> bool:
    """Whether GPT-2's dQ kernel could have run in one pass over each row in a row's step, by the engine's rules
    (``ftlib.training.engine.swaps._explicit_one_pass``): on the explicit attention kernel (which must have
    run where the row says; a row from before ``fuse_softmax_matmuls`` existed ran cuBLAS's products), rows
    of at most ``ONE_PASS_MAX_T`` keys, sm_80 or later (the 64-row tile's shared memory). A row without a
    capability (a CPU row) is taken to be one where it fits."""

    from kernels.explicit_attention import ONE_PASS_MAX_T

    # Before fuse_softmax_matmuls existed (the field absent), cuBLAS took the products around the softmax.
    if not ran.get("fuse_softmax_matmuls") or not _explicit_kernel_fits(row, ran):
        return False
    block = (row.get("config") or {}).get("block_size")
    cap = str(row.get("capability") or "")
    major = int(cap.split(".")[0]) if cap.split(".")[0].isdigit() else None
    return (block is None or block <= ONE_PASS_MAX_T) and (major is None or major >= 8)


def _explicit_kernel_fits(row: dict[str, Any], ran: dict[str, Any]) -> bool:
    """Whether GPT-2's explicit attention kernel could have taken a row's attention, by the engine's own rules
    (``ftlib.training.engine.swaps``): the fused softmax ran (explicit attention, kernels on, no attention
    kernel in its place), no attention dropout, a head size the kernels take, not strict fp32 without a dot
    precision. A row that ran with the option records any other reason in its softmax note."""
    cfg = row.get("config") or {}
    if not ran.get("fused_softmax") or "fuse_softmax_matmuls not" in str((ran.get("notes") or {}).get("softmax", "")):
        return False
    attn_dropout = cfg.get("attn_dropout")
    dropout = cfg.get("dropout", 0.0) if attn_dropout is None else attn_dropout
    head_size = cfg["n_embd"] // cfg["n_head"] if cfg.get("n_embd") and cfg.get("n_head") else None
    strict_fp32 = row.get("precision") == "fp32" and not ran.get("attention_precision")
    return not dropout and head_size in ATTN_HEAD_SIZES and not strict_fp32
