"""Benchmarks: scripts that print a results table per figure (not timed tests).

Run them with `scripts/bench` or `python -m bench.run [MODULE ...]` from the repository root.
Each module here (other than `run` and names starting with `_`) is one benchmark suite: it
exposes `run() -> list[Table]` (see bench._common). Ratios are measured side by side in one run
because the machines these run on are small, shared and noisy.
"""
