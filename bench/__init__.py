"""Benchmarks: `python -m bench.run [--quick]` from the repo root.

One machine (`run`): the same model at the same global batch on the same
devices with the unwrapped model_fn, `multi_gpu` (1, 2, 4 towers, shared and
replicated), MirroredStrategy + Estimator and the CIFAR-10 tutorial's
hand-written tower loop, each in its own subprocess, with timed windows
interleaved across systems. See docs/performance.md for how to read them.

- `run`: the coordinator; `schedule` runs the systems side by side;
  `worker` is one system's subprocess, talking `protocol` to the
  coordinator; `systems` are the systems under test, `specs` the models as
  plain data and `models` their model_fn; `report` turns timings into the
  table and JSON.
- `graphbuild`: graph-construction time per tower count; `precision`:
  accumulation memory and mixed-precision speed; `soak`: thousands of steps,
  memory and step time flat.
- `cluster`: across processes against ps, MultiWorkerMirrored and Horovod;
  `cluster_jobs` starts a run's jobs, `cluster_task` is one task,
  `cluster_horovod` the Horovod system, `cluster_trace` what a step
  executes, `cluster_model` the arithmetic (bytes per step, cost model),
  `cluster_report` the results, `cluster_paper` the on-paper tables.
- `plots`: the performance page's plots from the saved results.
"""
