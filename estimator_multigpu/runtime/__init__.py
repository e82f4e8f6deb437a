"""Running a training job: hooks, guards, scaling report, evaluation loop,
model-dir checkpoints and lock. Used by the scripts and the cluster; the
graph does not depend on it. Public (`estimator_multigpu.runtime.<module>`):

- `hooks`: `ProgressHook` (throughput, ETA), `with_training_hooks`.
- `guards`: `NonFiniteLossHook`, `FiniteCheckpointListener`, `SignalStop`.
- `scaling`: `ScalingReportHook` (input-bound or per-tower batch too small).
- `evaluation`: the evaluator's checkpoint loop.
- `checkpoints`: the checkpoints of a model dir, and unusable ones put aside.
- `model_dir_lock`: one writer per model dir.
- `process_exit`: ending a process at once, its model dir's lock released.
"""

__all__ = ["checkpoints", "evaluation", "guards", "hooks", "model_dir_lock",
           "process_exit", "scaling"]
