"""Benchmarks of torchx-elastic side by side with torchrun and the hand-made floor.

Run ``python bench/run.py`` from the repository root; see ``docs/bench.md``.
"""
