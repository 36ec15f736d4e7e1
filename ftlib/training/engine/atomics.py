"""Where the engine's gradient kernels add with atomic adds, and in which memory order (engine option
``relaxed_atomics``; :data:`kernels._common.ATOMIC_SEMS` says what the orders mean).

Each swap module that launches such a kernel keeps the order it was given as ``sem``: the fused embeddings
(:mod:`ftlib.training.engine.embedding`), the fused residual-norms (:mod:`ftlib.training.engine.norms`) and the
fused head (:mod:`ftlib.training.engine.head_loss`); the split-K weight gradients take it from the options
(:mod:`ftlib.training.engine.linears`). The option's note is read from what was set up, so it says what ran.
"""

from __future__ import annotations

from ftlib.model.gpt import GPT


def relaxed_atomics_note(model: GPT, wgrad_splitk: bool) -> str:
    """Option ``relaxed_atomics``'s note: which of the engine's gradient kernels with atomic adds took relaxed ones
    (each swap module keeps its ``sem``; the fused residual-norm adds only with ``dw_into``; ``wgrad_splitk``: the
    Linears' weight gradients run on the split-K kernel, whose adds the option relaxes), or why none did."""
    norms = getattr(model, "add_norm", None)
    modules = ((getattr(model, "embedding_sum", None), "the embeddings' gradients (kernels/embedding_sum.py)"),
               (norms if getattr(norms, "dw_into", False) else None,
                "the norms' weight gradients (kernels/residual_norm.py)"),
               (getattr(model, "head", None), "the fused head's dW (kernels/linear_cross_entropy.py)"))
    where = [what for module, what in modules if getattr(module, "sem", None) == "relaxed"]
    if wgrad_splitk:
        where.append("the split-K weight gradients (kernels/wgrad.py)")
    if not where:
        return ("not applied: needs fuse_embedding, norm_dw_into_buffer, fuse_head_loss or wgrad_splitk where they "
                "apply")
    return "atomic adds in relaxed memory order for " + ", ".join(where)
