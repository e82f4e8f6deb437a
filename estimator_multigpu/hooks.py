"""Training hooks: progress lines and TensorBoard throughput summaries.

`ProgressHook` logs, every N steps, the step, loss, learning rate, examples
per second (global and per tower) and the time left, and writes
`examples_per_sec` and `examples_per_sec_per_tower` summaries.
`with_training_hooks` attaches hooks built from the merged EstimatorSpec to a
(wrapped) model_fn, so they see the loss over the whole global batch.
"""

from __future__ import annotations

import datetime
import time
from typing import Callable, Optional

from absl import logging
import tensorflow as tf

tf1 = tf.compat.v1


class ProgressHook(tf1.train.SessionRunHook):
  """Logs step, loss, learning rate, examples/sec and ETA every N steps."""

  def __init__(self, loss: tf.Tensor, global_batch_size: int,
               num_towers: int, max_steps: Optional[int], every_n_steps: int,
               output_dir: Optional[str] = None,
               learning_rate_name: str = "current_learning_rate"):
    self._loss = loss
    self._global_batch_size = global_batch_size
    self._num_towers = num_towers
    self._max_steps = max_steps
    self._every_n_steps = every_n_steps
    self._output_dir = output_dir
    self._learning_rate_name = learning_rate_name
    self._last: Optional[tuple] = None  # (step, time)

  def begin(self):
    graph = tf1.get_default_graph()
    self._global_step = tf1.train.get_global_step()
    names = {op.name for op in graph.get_operations()}
    name = self._learning_rate_name
    self._learning_rate = (graph.get_tensor_by_name(f"{name}:0")
                           if name in names else tf.constant(float("nan")))
    self._writer = (tf1.summary.FileWriterCache.get(self._output_dir)
                    if self._output_dir else None)

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs(
        [self._global_step, self._loss, self._learning_rate])

  def after_run(self, run_context, run_values):
    step, loss, rate = run_values.results
    now = time.monotonic()
    if self._last is None:
      self._last = (step, now)
      return
    last_step, last_time = self._last
    if step - last_step < self._every_n_steps:
      return
    self._last = (step, now)
    self._report(step, loss, rate, (step - last_step) / (now - last_time))

  def _report(self, step: int, loss: float, rate: float,
              steps_per_sec: float) -> None:
    examples = steps_per_sec * self._global_batch_size
    per_tower = examples / self._num_towers
    eta = (datetime.timedelta(seconds=round((self._max_steps - step) /
                                            steps_per_sec))
           if self._max_steps and steps_per_sec > 0 else "?")
    logging.info("step %d  loss %.4f  lr %.5g  %.1f examples/sec (%.1f per "
                 "tower x %d)  ETA %s", step, loss, rate, examples, per_tower,
                 self._num_towers, eta)
    if self._writer:
      self._writer.add_summary(tf1.Summary(value=[
          tf1.Summary.Value(tag="examples_per_sec", simple_value=examples),
          tf1.Summary.Value(tag="examples_per_sec_per_tower",
                            simple_value=per_tower)]), step)


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
