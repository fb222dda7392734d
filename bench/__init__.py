"""Benchmarks: each module is one command (``python -m bench.<name>``) that prints a table and
writes its numbers as JSON under ``bench/results/``. Ratios are measured within one run."""
