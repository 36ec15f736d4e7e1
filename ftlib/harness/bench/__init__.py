"""The step benchmark: one training step measured in one execution mode and precision.

* :mod:`~ftlib.harness.bench.step`: ``bench_step`` (one case, one row) and the row's fields;
* :mod:`~ftlib.harness.bench.runners`: how each execution mode runs the step;
* :mod:`~ftlib.harness.bench.isolated`: the same in a fresh process with a hard time limit;
* :mod:`~ftlib.harness.bench.cases`: many cases, resumable (``Case``, ``bench_cases``, ``bench_sweep``).
"""
