"""Measuring: benchmarks, profiles, training studies and their result rows, with provenance."""
