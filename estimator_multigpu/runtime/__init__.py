"""Running a training job: hooks, guards, scaling report, evaluation loop,
model-dir checkpoints. Used by the scripts and the cluster; the graph does
not depend on it.
"""
