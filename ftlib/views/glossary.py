"""The words the book uses for how a step runs and how runs are compared (chapter 0), with the rule's
numbers read from the code that applies them, so the definitions cannot drift from the views."""

from __future__ import annotations

from ftlib.views.baselines import CONFIG_NAMES, MIN_MACHINES, MIN_RUNS, POST_CONFIG, TIE_BAND

# How a configuration's words read, one line each; every configuration name the tables use appears here.
_MEANING = {
    ("eager", "default"): "PyTorch as written: every kernel launched from Python; AdamW's multi-tensor "
                          "(foreach) update, PyTorch's default.",
    ("eager", "fused"): "the same with AdamW's fused kernel (`fused=True`).",
    ("cudagraph", "fused"): "no compiler: the eager step (fused AdamW) captured once as a CUDA graph and "
                            "replayed, one launch for the whole step.",
    ("compile", "default"): "`torch.compile` in its default mode on the model; the optimizer runs outside "
                            "the compiled code.",
    ("compile", "fused"): "the same with the fused AdamW kernel outside.",
    ("compile", "whole-step"): "forward, backward and the AdamW update compiled as one function.",
    ("compile-ro", "default"): "`torch.compile(mode=\"reduce-overhead\")`, which also replays the compiled "
                               "kernels as CUDA graphs; AdamW outside, as the post ran it.",
    ("compile-ro", "fused"): "the same with the fused AdamW kernel outside.",
    ("compile-ro", "whole-step"): "reduce-overhead with the whole step compiled.",
    ("compile", "whole-step-ca"): "the whole step compiled with compiled autograd (the backward traced "
                                  "into a graph of its own).",
    ("compile-ro", "whole-step-ca"): "the same under reduce-overhead.",
    ("compile", "graphed"): "`torch.compile` in its default mode on the model, and the step (forward, backward "
                            "and the fused AdamW update) captured once as a CUDA graph and replayed: the "
                            "compiler's kernels with no host work between them.",
    ("engine", "default"): "the book's own whole-step engine: its Triton kernels, flat parameter and "
                           "gradient buffers, and the whole step replayed as one CUDA graph (chapter 6).",
}


def glossary_markdown() -> str:
    """The glossary as Markdown: configurations, then the words of the comparison rule."""
    missing = sorted(set(CONFIG_NAMES) - set(_MEANING))
    if missing:
        raise ValueError(f"configurations without a meaning in the glossary: {missing}")
    lines = ["**How a step runs** (each table names its configuration in these words; a *step* is zero_grad, "
             "forward, loss, backward and the AdamW update of one batch of B sequences of T tokens):", ""]
    lines += [f"- *{CONFIG_NAMES[k]}*: {_MEANING[k]}" for k in CONFIG_NAMES]
    lines += ["", "**Precisions**: *fp32*, strict fp32 matmuls; *tf32*, fp32 storage with TF32 tensor-core "
              "matmuls; *bf16* and *fp16*, fp32 weights with the step under autocast to that type (mixed "
              "precision; fp16 with dynamic loss scaling).", "",
              "**How runs are compared**:", "",
              "- a *run* is one fresh process that measures a set of cases (a *suite*) on one GPU; a *machine "
              "start* is a fresh start of a GPU machine (a cloud instance), whose host may differ from the last;",
              f"- the *strongest baseline* of a run is its fastest configuration other than eager and the engine "
              f"(the compiled ones and the manual CUDA graph); the post's own is *{CONFIG_NAMES[POST_CONFIG]}*;",
              "- a speed-up pairs two rows of the same run and is reported as the median over runs with the "
              "slowest and fastest run; step times are medians with their p20–p80 spread;",
              f"- a *verdict* needs at least {MIN_RUNS} runs on {MIN_MACHINES} machine starts with every run on "
              f"one side: *faster*, *slower*, or *ties* when every run lies within ±{TIE_BAND:.0%}; otherwise "
              "*too few runs* or *no verdict: the runs disagree*."]
    return "\n".join(lines)
