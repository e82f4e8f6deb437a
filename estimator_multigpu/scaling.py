"""A scaling report for training runs: throughput, input wait, and advice.

`ScalingReportHook` answers the question behind "N GPUs are slower than one":
is the run limited by the devices, by the input pipeline, or by a per-tower
batch too small to keep a device busy? Every `every_n_steps` steps it logs

    scaling: step 201: 1843.2 examples/sec (460.8 per tower x 4 towers,
    global batch 256, 138.9 ms/step over 100 steps); input wait 41%
    (IteratorGetNext 57.1 ms of a 138.9 ms traced step)

and a WARNING with a concrete fix when the run is input-bound or the
per-tower batch is small. Use it with any Estimator, wrapped or not:

    from estimator_multigpu import scaling
    hook = scaling.ScalingReportHook(global_batch_size=256, num_towers=4)
    estimator.train(input_fn, max_steps=10000, hooks=[hook])

How the input wait is measured: once per reporting period (its last step, so
a prefetch buffer filled during start-up is drained by then; never the first
step of training, whose input includes pipeline start-up) the hook asks for a
`FULL_TRACE` of one step through `SessionRunArgs(options=...)`, which works
inside Estimator's MonitoredSession like `ProfilerHook`. In the returned
`step_stats`, the input op (`IteratorGetNext`, or a queue dequeue when the
input_fn returns queue-fed tensors) runs from when the step asks for the next
batch until the pipeline hands it over, so its wall time is the time the step
waited for input; the traced step's wall time is the span from its first op
start to its last op end. The share is the longest input op over that span.
Every other step is untraced, so the examples/sec (steps x global batch /
wall-clock seconds between reports) is what the run really achieves. One
traced step is a sample: a pipeline that stalls now and then shows up in some
reports and not in others.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

from absl import logging
import tensorflow as tf

tf1 = tf.compat.v1

INPUT_OP_TYPES = frozenset([
    "IteratorGetNext", "IteratorGetNextSync", "QueueDequeueV2",
    "QueueDequeueManyV2", "QueueDequeueUpToV2"])
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
  """One reporting period of `ScalingReportHook`."""
  step: Optional[int]          # global step read during the reporting step.
  steps: int                   # steps run in the period.
  seconds: float               # wall-clock seconds of the period.
  global_batch_size: int
  num_towers: int
  input_wait: Optional[InputWait]

  @property
  def examples_per_sec(self) -> float:
    return self.steps * self.global_batch_size / self.seconds

  @property
  def examples_per_sec_per_tower(self) -> float:
    return self.examples_per_sec / self.num_towers

  @property
  def ms_per_step(self) -> float:
    return 1000.0 * self.seconds / self.steps


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
  """Logs examples/sec (global and per tower) and the input-wait share.

  See the module docstring for how the input wait is measured. WARNINGs:
  once at the start when the per-tower batch is below `min_per_tower_batch`
  on GPUs; at a report when the traced step waited for input for more than
  `input_bound_share` of its time.
  """

  def __init__(self, global_batch_size: int, num_towers: int,
               every_n_steps: int = 100,
               input_bound_share: float = INPUT_BOUND_SHARE,
               min_per_tower_batch: int = MIN_PER_TOWER_BATCH_GPU,
               on_gpu: Optional[bool] = None):
    """Creates the hook.

    Args:
      global_batch_size: examples per step over all towers.
      num_towers: how many towers share the global batch.
      every_n_steps: steps between two reports (>= 1).
      input_bound_share: warn when the input wait is above this share.
      min_per_tower_batch: warn when the per-tower batch is below this.
      on_gpu: whether the towers are GPUs (the small-batch warning is for
        GPUs); None: whether TensorFlow sees a GPU.

    Raises:
      ValueError: a count is below 1 or the share is outside (0, 1).
    """
    for name, value in (("global_batch_size", global_batch_size),
                        ("num_towers", num_towers),
                        ("every_n_steps", every_n_steps)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an int >= 1; got {value!r}.")
    if not 0.0 < input_bound_share < 1.0:
      raise ValueError(f"`input_bound_share` is {input_bound_share}; "
                       "expected a number in (0, 1), e.g. 0.3.")
    self._global_batch_size = global_batch_size
    self._num_towers = num_towers
    self._every_n_steps = every_n_steps
    self._input_bound_share = input_bound_share
    self._min_per_tower_batch = min_per_tower_batch
    self._on_gpu = on_gpu
    self.reports: list = []  # every ScalingReport logged, oldest first.

  def begin(self):
    graph = tf1.get_default_graph()
    self._input_ops = frozenset(op.name for op in graph.get_operations()
                                if op.type in INPUT_OP_TYPES)
    self._global_step = tf1.train.get_global_step()
    self._steps, self._start, self._wait = 0, None, None
    on_gpu = (self._on_gpu if self._on_gpu is not None
              else bool(tf.config.list_physical_devices("GPU")))
    advice = per_tower_batch_advice(self._global_batch_size,
                                    self._num_towers,
                                    self._min_per_tower_batch)
    if on_gpu and advice:
      logging.warning(advice)

  def _traces(self, step: int) -> bool:
    """The last step of each period (the reporting one), never the first."""
    return step > 1 and (step - 1) % self._every_n_steps == 0

  def before_run(self, run_context):
    self._steps += 1
    fetches = {"step": self._global_step} if self._global_step is not None \
        else {}
    if not self._traces(self._steps) or not self._input_ops:
      return tf1.train.SessionRunArgs(fetches)
    return tf1.train.SessionRunArgs(fetches, options=tf1.RunOptions(
        trace_level=tf1.RunOptions.FULL_TRACE))

  def after_run(self, run_context, run_values):
    now = time.perf_counter()
    if self._traces(self._steps) and run_values.run_metadata is not None:
      self._wait = input_wait_from_step_stats(
          run_values.run_metadata.step_stats, self._input_ops) or self._wait
    if self._start is None:
      self._start = (self._steps, now)
      return
    if (self._steps - 1) % self._every_n_steps == 0:
      first, started = self._start
      self._report(ScalingReport(
          (run_values.results or {}).get("step"), self._steps - first,
          now - started, self._global_batch_size, self._num_towers,
          self._wait))
      self._start, self._wait = (self._steps, now), None

  def _report(self, report: ScalingReport) -> None:
    self.reports.append(report)
    wait = report.input_wait
    wait_text = ("input wait n/a (no input op traced)" if wait is None else
                 f"input wait {100 * wait.share:.0f}% ({wait.op_name} "
                 f"{wait.input_ms:.1f} ms of a {wait.step_ms:.1f} ms traced "
                 "step)")
    logging.info(
        "scaling: step %s: %.1f examples/sec (%.1f per tower x %d towers, "
        "global batch %d, %.1f ms/step over %d steps); %s",
        report.step if report.step is not None else "?",
        report.examples_per_sec, report.examples_per_sec_per_tower,
        report.num_towers, report.global_batch_size, report.ms_per_step,
        report.steps, wait_text)
    if wait is not None and wait.share > self._input_bound_share:
      logging.warning(input_bound_advice(report))
