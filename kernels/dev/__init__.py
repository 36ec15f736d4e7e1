"""Check-then-time drivers, one per op (llm.c's dev/cuda style): ``python -m kernels.dev.<op>_dev``."""
