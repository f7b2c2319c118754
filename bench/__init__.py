"""Benchmarks that measure irpe-deploy side by side (``irpe bench ...``)."""
