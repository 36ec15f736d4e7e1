"""The engine: the training step on Triton kernels and flat buffers, captured in one CUDA graph.

* :mod:`~ftlib.training.engine.options`: its options (one validated set) and the precision resolved for it;
* :mod:`~ftlib.training.engine.swaps`: the modules that put the kernels in the model's place;
* :mod:`~ftlib.training.engine.norms`: the residual adds and the norms after them on the fused kernels;
* :mod:`~ftlib.training.engine.flat`: flat parameter and gradient buffers, and AdamW on them;
* :mod:`~ftlib.training.engine.bf16_weights`: Linear layers on a bf16 copy of the flat weights;
* :mod:`~ftlib.training.engine.grad_into`: Linear layers that write their weight gradients into the flat gradient;
* :mod:`~ftlib.training.engine.linears`: which Linear layers go onto the bf16 copy and into the flat gradient;
* :mod:`~ftlib.training.engine.engine`: the Engine (warm-up, capture, step).

Its check against reference training is a measurement: ``ftlib.harness.engine_check``.
"""

from ftlib.training.engine.engine import Engine
from ftlib.training.engine.options import KERNEL_OPS, EngineOptions

__all__ = ["KERNEL_OPS", "Engine", "EngineOptions"]
