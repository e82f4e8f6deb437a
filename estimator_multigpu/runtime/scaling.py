"""A scaling report for training runs: throughput, input wait, and advice.

`ScalingReportHook` answers the question behind "N GPUs are slower than one":
is the run limited by the devices, by the input pipeline, or by a per-tower
batch too small to keep a device busy? At the end of each window of a
`hooks.ProgressHook` it logs

    scaling: step 200: 1843.2 examples/sec (460.8 per tower x 4 towers,
    global batch 256, 138.9 ms/step over 100 steps); input wait 41%
    (IteratorGetNext 57.1 ms of a 138.9 ms traced step)

and a WARNING with a concrete fix when the run is input-bound or the
per-tower batch is small. It measures no time itself: the examples/sec and
ms/step are the `Throughput` the progress hook measured for the same window
(and logged on the line before), so the logs and TensorBoard show one
number. Give it the progress hook and pass both to Estimator:

    from estimator_multigpu import hooks, scaling

    def make_hooks(spec):
      progress = hooks.ProgressHook(spec.loss, global_batch_size=256,
                                    num_towers=4, max_steps=10000,
                                    every_n_steps=100)
      return [progress, scaling.ScalingReportHook(progress)]

    estimator = tf.estimator.Estimator(
        hooks.with_training_hooks(emg.multi_gpu(model_fn), make_hooks))

How the input wait is measured: in each window, the hook traces one step,
the one expected to end the window (so a prefetch buffer filled during
start-up is drained by then; never the first step of training, whose input
includes pipeline start-up), through `SessionRunArgs(options=...)` with a
`SOFTWARE_TRACE`: the executor's own step stats, without starting the
profiler (which logs five lines per trace). A distributed session (a cluster
task's) returns step stats for a `FULL_TRACE` only, so there the hook asks
for that. In the returned `step_stats`, the input op (`IteratorGetNext`, or
a queue dequeue when the input_fn returns queue-fed tensors) runs from when
the step asks for the next batch until the pipeline hands it over, so its
wall time is the time the step waited for input; the traced step's wall
time is the span from its first op start to its last op end. The share is
the longest input op over that span. Every other step is untraced, so the
window's throughput is what the run really achieves. One traced step is a
sample: a pipeline that stalls now and then shows up in some reports and
not in others.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from absl import logging
import tensorflow as tf

from estimator_multigpu.graph import dataflow
from estimator_multigpu.runtime import hooks

tf1 = tf.compat.v1

__all__ = ["InputWait", "ScalingReport", "ScalingReportHook",
           "input_bound_advice", "input_wait_from_step_stats",
           "per_tower_batch_advice"]

INPUT_BOUND_SHARE = 0.3
MIN_PER_TOWER_BATCH_GPU = 16


@dataclasses.dataclass(frozen=True)
class InputWait:
  """From one traced step: the input op's and the step's wall time (ms)."""
  op_name: str
  input_ms: float
  step_ms: float

  @property
  def share(self) -> float:
    return self.input_ms / self.step_ms if self.step_ms > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class ScalingReport:
  """One window of `ScalingReportHook`: the progress hook's throughput."""
  throughput: hooks.Throughput
  input_wait: Optional[InputWait]


def input_wait_from_step_stats(step_stats, input_ops: frozenset
                               ) -> Optional[InputWait]:
  """The longest input op and the step's span in a traced step, or None."""
  starts, ends, longest = [], [], None  # longest: (micros, op name).
  for device in step_stats.dev_stats:
    for node in device.node_stats:
      starts.append(node.all_start_micros)
      ends.append(node.all_start_micros + node.all_end_rel_micros)
      if node.node_name in input_ops:
        longest = max(longest or (0, ""), (node.all_end_rel_micros,
                                           node.node_name))
  if longest is None:
    return None
  return InputWait(longest[1], longest[0] / 1000.0,
                   (max(ends) - min(starts)) / 1000.0)


def per_tower_batch_advice(global_batch_size: int, num_towers: int,
                           min_per_tower: int) -> Optional[str]:
  """A warning text when the smallest shard is below `min_per_tower`."""
  per_tower = global_batch_size // num_towers
  if per_tower >= min_per_tower:
    return None
  most_towers = max(1, global_batch_size // min_per_tower)
  return (f"scaling: the per-tower batch is {per_tower} examples (global "
          f"batch {global_batch_size} over {num_towers} towers), too small "
          "to keep a device busy: each step pays the fixed per-step costs "
          f"for little work. Raise the global batch to at least "
          f"{min_per_tower * num_towers} (and scale the learning rate with "
          f"it), or use fewer towers (at most {most_towers} at this batch).")


def input_bound_advice(report: ScalingReport) -> str:
  wait = report.input_wait
  return (f"scaling: the run is input-bound: {100 * wait.share:.0f}% of a "
          f"traced step ({wait.input_ms:.1f} of {wait.step_ms:.1f} ms) waited "
          "for the input pipeline, so more towers will not go faster. In the "
          "input_fn, use num_parallel_calls=tf.data.AUTOTUNE in "
          "Dataset.map, end with .prefetch(tf.data.AUTOTUNE), read files "
          "with more reader threads (Dataset.interleave with "
          "num_parallel_calls), or cache decoded examples.")


class ScalingReportHook(tf1.train.SessionRunHook):
  """Logs the input-wait share with the progress hook's examples/sec.

  See the module docstring for how the input wait is measured. WARNINGs:
  once at the start when the per-tower batch is below `min_per_tower_batch`
  on GPUs; at a report when the traced step waited for input for more than
  `input_bound_share` of its time.
  """

  def __init__(self, progress: hooks.ProgressHook,
               input_bound_share: float = INPUT_BOUND_SHARE,
               min_per_tower_batch: int = MIN_PER_TOWER_BATCH_GPU,
               on_gpu: Optional[bool] = None,
               report_level: int = logging.INFO,
               repeat_warnings: bool = True):
    """Creates the hook and makes it a listener of `progress`.

    Args:
      progress: the hook that measures the throughput and decides the
        windows (its global batch and tower count are the report's); pass
        both hooks to the same `train` call.
      input_bound_share: warn when the input wait is above this share.
      min_per_tower_batch: warn when the per-tower batch is below this.
      on_gpu: whether the towers are GPUs (the small-batch warning is for
        GPUs); None: whether TensorFlow sees a GPU.
      report_level: the absl level of the per-window report line, e.g.
        `logging.DEBUG` to show it only with --verbosity=1 (the progress
        line already shows the same examples/sec); warnings stay WARNING.
      repeat_warnings: False: the input-bound WARNING is logged once per
        training session; later input-bound windows say so at
        `report_level`.

    Raises:
      ValueError: the share is outside (0, 1).
    """
    if not 0.0 < input_bound_share < 1.0:
      raise ValueError(f"`input_bound_share` is {input_bound_share}; "
                       "expected a number in (0, 1), e.g. 0.3.")
    self._progress = progress
    self._input_bound_share = input_bound_share
    self._min_per_tower_batch = min_per_tower_batch
    self._on_gpu = on_gpu
    self._report_level = report_level
    self._repeat_warnings = repeat_warnings
    self._warned = False
    self._input_ops = frozenset()
    self._reset()
    self.reports: list = []  # every ScalingReport logged, oldest first.
    progress.add_listener(self._report_window)

  def begin(self):
    graph = tf1.get_default_graph()
    self._input_ops = frozenset(op.name for op in graph.get_operations()
                                if op.type in dataflow.INPUT_DEQUEUES)
    self._reset()
    self._warned = False
    on_gpu = (self._on_gpu if self._on_gpu is not None
              else bool(tf.config.list_physical_devices("GPU")))
    advice = per_tower_batch_advice(self._progress.global_batch_size,
                                    self._progress.num_towers,
                                    self._min_per_tower_batch)
    if on_gpu and advice:
      logging.warning(advice)

  def _reset(self) -> None:
    self._trace_level = tf1.RunOptions.SOFTWARE_TRACE
    self._runs = 0  # runs of this session.
    self._traced = False  # whether the current run is traced.
    self._reported_run = 0  # the run whose window was reported last.
    self._wait: Optional[InputWait] = None  # traced earlier in the window.

  def after_create_session(self, session, coord):
    # A distributed (grpc) session returns step stats for a FULL_TRACE only.
    self._trace_level = (tf1.RunOptions.FULL_TRACE if session.sess_str else
                         tf1.RunOptions.SOFTWARE_TRACE)

  def before_run(self, run_context):
    self._runs += 1
    self._traced = (bool(self._input_ops) and
                    self._progress.next_run_may_end_window())
    if not self._traced:
      return None
    return tf1.train.SessionRunArgs(None, options=tf1.RunOptions(
        trace_level=self._trace_level))

  def after_run(self, run_context, run_values):
    # A traced run that did not end a window (the global step moved less
    # than expected): keep its sample for the window's report.
    if self._traced and self._reported_run != self._runs:
      self._wait = self._input_wait(run_values.run_metadata) or self._wait

  def _input_wait(self, run_metadata) -> Optional[InputWait]:
    return input_wait_from_step_stats(run_metadata.step_stats,
                                      self._input_ops)

  def _report_window(self, throughput: hooks.Throughput,
                     run_metadata) -> None:
    """The progress hook's listener: one report per window."""
    wait = (self._input_wait(run_metadata) if self._traced else None
            ) or self._wait
    self._reported_run, self._wait = self._runs, None
    self._report(ScalingReport(throughput, wait))

  def _report(self, report: ScalingReport) -> None:
    self.reports.append(report)
    throughput, wait = report.throughput, report.input_wait
    wait_text = ("input wait n/a (no input op traced)" if wait is None else
                 f"input wait {100 * wait.share:.0f}% ({wait.op_name} "
                 f"{wait.input_ms:.1f} ms of a {wait.step_ms:.1f} ms traced "
                 "step)")
    logging.log(
        self._report_level, "scaling: step %d: %.1f examples/sec (%.1f per "
        "tower x %d towers, global batch %d, %.1f ms/step over %d steps); "
        "%s", throughput.step, throughput.examples_per_sec,
        throughput.examples_per_sec_per_tower, throughput.num_towers,
        throughput.global_batch_size, throughput.ms_per_step,
        throughput.steps, wait_text)
    if wait is not None and wait.share > self._input_bound_share:
      level = (logging.WARNING if self._repeat_warnings or not self._warned
               else self._report_level)
      logging.log(level, input_bound_advice(report))
      self._warned = True
