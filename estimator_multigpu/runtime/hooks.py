"""Training hooks: progress and throughput.

- `ProgressHook` logs a first line after the first step (its duration and
  a first ETA), then measures the throughput once per window of N global
  steps or 30 seconds, whichever ends first (`Throughput`), and logs the
  step, loss, learning rate, examples per second (global and per tower) and
  the time left, and writes `examples_per_sec`
  and `examples_per_sec_per_tower` summaries. It is the one source of every
  examples/sec figure: listeners, such as the scaling report
  (`scaling.ScalingReportHook`), receive its `Throughput` for the window.
- The guards against lost work (`NonFiniteLossHook`,
  `FiniteCheckpointListener`, `SignalStop`) live in `guards`.
- `with_training_hooks` attaches hooks built from the merged EstimatorSpec to
  a (wrapped) model_fn, so they see the loss over the whole global batch.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from typing import Callable, Optional

from absl import logging
import tensorflow as tf

__all__ = ["ProgressHook", "Throughput", "with_training_hooks"]

tf1 = tf.compat.v1
DEFAULT_EVERY_SECS = 30.0  # a progress line at least this often.


@dataclasses.dataclass(frozen=True)
class Throughput:
  """The examples per second of one window of global steps.

  A global step is one update: on a cluster of asynchronous workers, one
  worker's batch; `global_batch_size` is the examples it stands for.
  """
  step: int                # global step read at the window's end.
  steps: int               # global steps in the window.
  seconds: float           # wall-clock seconds of the window.
  global_batch_size: int   # examples per global step.
  num_towers: int

  @property
  def steps_per_sec(self) -> float:
    return self.steps / self.seconds

  @property
  def examples_per_sec(self) -> float:
    return self.steps_per_sec * self.global_batch_size

  @property
  def examples_per_sec_per_tower(self) -> float:
    return self.examples_per_sec / self.num_towers

  @property
  def ms_per_step(self) -> float:
    return 1000.0 * self.seconds / self.steps


# Called as listener(throughput, run_metadata) at the end of each window.
ThroughputListener = Callable[[Throughput, tf1.RunMetadata], None]


class ProgressHook(tf1.train.SessionRunHook):
  """Logs step, loss, learning rate, examples/sec and ETA every N steps or
  `every_secs`, whichever comes first.

  The first run is timed and logged on its own (a first step builds and
  warms up, so its ETA is an upper bound), and starts the clock; a window
  ends at the first run whose global step is at least `every_n_steps` past
  the window's start, or that ends `every_secs` or more after it.
  """

  def __init__(self, loss: tf.Tensor, global_batch_size: int,
               num_towers: int, max_steps: Optional[int], every_n_steps: int,
               output_dir: Optional[str] = None,
               learning_rate_name: str = "current_learning_rate",
               every_secs: Optional[float] = DEFAULT_EVERY_SECS,
               clock: Callable[[], float] = time.monotonic):
    """Creates the hook.

    Args:
      loss: the loss tensor to log (the merged spec's).
      global_batch_size: examples per global step over all towers.
      num_towers: how many towers share the global batch.
      max_steps: the last global step, for the ETA; None: no ETA.
      every_n_steps: global steps per window (>= 1).
      output_dir: where to write the throughput summaries; None: only log.
      learning_rate_name: the op whose value is logged as the learning rate.
      every_secs: a window also ends this many seconds after its start
        (None: by steps only).
      clock: the monotonic clock, in seconds (tests pass their own).

    Raises:
      ValueError: a count is below 1.
    """
    for name, value in (("global_batch_size", global_batch_size),
                        ("num_towers", num_towers),
                        ("every_n_steps", every_n_steps)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an int >= 1; got {value!r}.")
    self._loss = loss
    self._global_batch_size = global_batch_size
    self._num_towers = num_towers
    self._max_steps = max_steps
    self._every_n_steps = every_n_steps
    self._output_dir = output_dir
    self._learning_rate_name = learning_rate_name
    self._every_secs = every_secs
    self._clock = clock
    self._first_run_start: Optional[float] = None
    self._listeners: list = []
    self._start: Optional[tuple] = None  # (step, time) of the window's start.
    self._step: Optional[int] = None  # the global step read last.
    self._increment = 1  # how far the global step moved in the last run.

  @property
  def global_batch_size(self) -> int:
    return self._global_batch_size

  @property
  def num_towers(self) -> int:
    return self._num_towers

  def add_listener(self, listener: ThroughputListener) -> None:
    """Calls `listener(throughput, run_metadata)` at the end of each window.

    After this hook's own line; `run_metadata` is the one of the run that
    ended the window (with a trace when a hook asked for one).
    """
    self._listeners.append(listener)

  def next_run_may_end_window(self) -> bool:
    """Whether the next run is expected to end the current window.

    Expects the global step to move as far as in the last run: one step per
    run locally, more on a cluster whose workers update asynchronously.
    False before the first run, which only starts the clock.
    """
    if self._start is None:
      return False
    return self._step + self._increment - self._start[0] >= (
        self._every_n_steps) or self._time_is_up(self._clock())

  def _time_is_up(self, now: float) -> bool:
    return self._every_secs is not None and (
        now - self._start[1] >= self._every_secs)

  def begin(self):
    graph = tf1.get_default_graph()
    self._global_step = tf1.train.get_global_step()
    names = {op.name for op in graph.get_operations()}
    name = self._learning_rate_name
    self._learning_rate = (graph.get_tensor_by_name(f"{name}:0")
                           if name in names else tf.constant(float("nan")))
    self._writer = (tf1.summary.FileWriterCache.get(self._output_dir)
                    if self._output_dir else None)
    self._start, self._step, self._increment = None, None, 1
    self._first_run_start = None

  def before_run(self, run_context):
    if self._start is None and self._first_run_start is None:
      self._first_run_start = self._clock()
    return tf1.train.SessionRunArgs(
        [self._global_step, self._loss, self._learning_rate])

  def after_run(self, run_context, run_values):
    step, loss, rate = run_values.results
    now = self._clock()
    if self._step is not None:
      self._increment = max(step - self._step, 1)
    self._step = step
    if self._start is None:
      self._start = (step, now)
      self._report_first(step, loss, rate, now - self._first_run_start)
      return
    start_step, start_time = self._start
    if step - start_step < self._every_n_steps and not (
        step > start_step and self._time_is_up(now)):
      return
    self._start = (step, now)
    throughput = Throughput(step, step - start_step, now - start_time,
                            self._global_batch_size, self._num_towers)
    self._report(throughput, loss, rate)
    for listener in self._listeners:
      listener(throughput, run_values.run_metadata)

  def _report_first(self, step: int, loss: float, rate: float,
                    seconds: float) -> None:
    """The line after the first step: its duration and a first ETA (an
    upper bound: the first step also builds and warms up)."""
    left = (self._max_steps - step) if self._max_steps else None
    eta = (f"at most {datetime.timedelta(seconds=round(left * seconds))}"
           if left is not None else "?")
    logging.info("step %d  loss %.4f  lr %.5g  first step %.1f s (start-up "
                 "included)  ETA %s; next line within %s", step, loss, rate,
                 seconds, eta, self._next_line())

  def _next_line(self) -> str:
    steps = f"{self._every_n_steps} step{'' if self._every_n_steps == 1 else 's'}"
    return (f"{steps} or {self._every_secs:g} s" if self._every_secs
            else steps)

  def _report(self, throughput: Throughput, loss: float, rate: float) -> None:
    examples = throughput.examples_per_sec
    per_tower = throughput.examples_per_sec_per_tower
    eta = (datetime.timedelta(seconds=round(
        (self._max_steps - throughput.step) / throughput.steps_per_sec))
           if self._max_steps else "?")
    logging.info("step %d  loss %.4f  lr %.5g  %.1f examples/sec (%.1f per "
                 "tower x %d)  ETA %s", throughput.step, loss, rate, examples,
                 per_tower, self._num_towers, eta)
    if self._writer:
      self._writer.add_summary(tf1.Summary(value=[
          tf1.Summary.Value(tag="examples_per_sec", simple_value=examples),
          tf1.Summary.Value(tag="examples_per_sec_per_tower",
                            simple_value=per_tower)]), throughput.step)


HookFactory = Callable[[tf.estimator.EstimatorSpec], list]


def with_training_hooks(model_fn: Callable, make_hooks: HookFactory):
  """Wraps `model_fn` so TRAIN specs also carry `make_hooks(spec)`."""

  def model_fn_with_hooks(features, labels, mode, params, config):
    spec = model_fn(features, labels, mode, params, config)
    if mode != tf.estimator.ModeKeys.TRAIN:
      return spec
    return spec._replace(training_hooks=tuple(spec.training_hooks) +
                         tuple(make_hooks(spec)))

  return model_fn_with_hooks
