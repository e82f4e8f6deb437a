"""Throughput benchmark: `python -m bench.run [--quick]` from the repo root.

Trains the same model at the same global batch on the same devices with the
unwrapped model_fn, `multi_gpu` (1, 2, 4 towers), MirroredStrategy + Estimator
and the CIFAR-10 tutorial's hand-written tower loop, each in its own
subprocess, with timed windows interleaved across systems. See
docs/performance.md for how to read the results.
"""
