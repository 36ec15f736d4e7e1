"""Training: the step, the data, the trainer and the engine (kernels, flat buffers, one CUDA graph)."""
