"""Weight-gradient GEMMs on a second CUDA stream, joined before anything reads the gradients.

In a Linear's backward (``grad_into.py``) two GEMMs read dy: dx = dy W, which the layers below wait for,
and dW = dy^T x, which only the optimizer reads, after the whole backward. On one stream every dW GEMM
sits on the path from the loss to the first layer. At the engine's sizes most kernels of that path fill
only part of the GPU (a few hundred tiles or programs for 132 SMs), so a dW GEMM issued on another
stream can run beside them. This is the split of the backward into its input-gradient and
weight-gradient parts that pipeline-parallel schedules exploit (Qi et al., "Zero Bubble Pipeline
Parallelism", arXiv:2401.10241: B, the input gradient, and W, the weight gradient, scheduled apart);
here W only moves to a second stream of the same step.

The order is kept by two edges per Linear and one at the end, as stream semantics require (PyTorch's
CUDA semantics notes, "CUDA streams"):

* fork: the side stream waits for the main stream at the point where dy is ready (an event), then runs
  the GEMM into the weight's view of the flat gradient, which the step zeroed on the main stream before;
* keep: dy and x are freed when the Linear's backward returns, while the side stream may still read
  them; ``record_stream`` tells the caching allocator not to hand their memory out before the side
  stream's work on them is done;
* join: after the backward the main stream waits for the side stream, before clipping and the
  optimizer read the gradients.

Inside a CUDA graph capture the fork and join become edges of the graph (PyTorch's CUDA graphs notes
allow other streams in a capture when they join the capturing stream before it ends), so a replay
pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class WGradStream:
    """A side stream for the weight-gradient GEMMs of one engine (one device)."""

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise ValueError(f"a weight-gradient stream needs a CUDA device, got {device}")
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.forked = False  # work queued on the side stream that the main stream has not joined yet

    def run(self, work: Callable[[], object], *keep: torch.Tensor) -> None:
        """Queue ``work`` on the side stream after everything queued so far on the current stream;
        ``keep``: the tensors it reads that the caller may free before it runs."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            work()
        for t in keep:
            t.record_stream(self.stream)
        self.forked = True

    def join(self) -> None:
        """Make the current stream wait for the side stream's work (nothing to do when none was queued:
        a capture must not wait on an event recorded outside it)."""
        if self.forked:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            self.forked = False


def wgrad_stream_for(device: torch.device, asked: bool, grad_into: bool,
                     low_precision: bool) -> tuple[WGradStream | None, str | None]:
    """(the stream, its note) for option ``wgrad_side_stream``: a stream where it is asked for and applies
    (``low_precision``: the step runs under bf16/fp16 autocast); (None, why not) where it is asked for and
    does not; (None, None) where it is not asked for."""
    if not asked:
        return None, None
    if not grad_into:
        return None, "not applied: needs grad_into_buffer"
    if not low_precision:
        return None, "not applied: bf16 and fp16 only (in tf32 its trial was mixed: chapter 6)"
    if device.type != "cuda":
        return None, f"not applied: streams are CUDA's, the device is {device.type}"
    return WGradStream(device), "weight-gradient GEMMs on a second stream, joined after the backward"
