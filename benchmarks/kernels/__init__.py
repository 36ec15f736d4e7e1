"""The kernels measured: check-then-time drivers, one per op (``python -m benchmarks.kernels.<op>_dev``),
the suite that runs them all (``python -m benchmarks.kernels.suite``), the engine probe, the
ahead-of-time compile check, and the lab notes (NOTES.md). Depends on ftlib and kernels; nothing
imports it."""
