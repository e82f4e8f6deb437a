"""float16's dynamic loss scale: one decision for every tower and call.

TensorFlow's `tf.compat.v1.mixed_precision.DynamicLossScale` holds the scale
(initially 2¹⁵) and its rule: after `increment_period` (2000) finite updates
in a row the scale doubles; on an Inf/NaN gradient it halves (not below 1) and
the update is skipped. Each tower differentiates loss × scale
(`graph.precision.scale_loss`); the update chain divides the combined
gradients by the scale (a power of two: exact) and applies them only if every
gradient of the step, every tower's and every micro-batch's, was finite. A
skipped update moves nothing, `global_step` and the EMA included. A skip is
logged as a WARNING and written to TensorBoard (`loss_scale`,
`skipped_updates`); a skip at loss scale 1 stops training with
`NonFiniteGradientsError`. The scale is a local variable (`loss_scale/...`),
so checkpoints stay portable between precisions.
"""

from __future__ import annotations

from typing import Any, Optional

from absl import logging
import numpy as np
import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu.update import chain

tf1 = tf.compat.v1


class NonFiniteGradientsError(RuntimeError):
  """float16 gradients overflow even at loss scale 1."""


class LossScaling:
  """float16's dynamic loss scale for one graph (TF's `DynamicLossScale`)."""

  def __init__(self, device: Optional[str], initial_scale: float = 2.0 ** 15,
               increment_period: int = 2000, multiplier: float = 2.0):
    graph = tf1.get_default_graph()
    with tf.device(device), tf.control_dependencies(None), \
        graph.name_scope("loss_scale/"):
      self._loss_scale = tf1.mixed_precision.DynamicLossScale(
          initial_scale, increment_period, multiplier)
      self.skipped = tf1.Variable(0, dtype=tf.int64, trainable=False,
                                  name="skipped_updates", use_resource=True)
      _make_local(list(compat.private(self._loss_scale, "_weights").values())
                  + [self.skipped])
      # One read per step: the towers scale by it and the update unscales by
      # it, whatever the update then assigns.
      self.value = tf.identity(self._loss_scale(), name="value")
    self.should_apply: Optional[tf.Tensor] = None

  def unscale(self, grads_and_vars: list) -> list:
    """Divides each gradient by the loss scale."""
    reciprocal = 1.0 / self.value
    return [(_times(g, reciprocal), v) for g, v in grads_and_vars]

  def update(self, should_apply: tf.Tensor) -> tf.Operation:
    """The loss-scale update for a step whose gradients are finite iff
    `should_apply`; counts skipped steps."""
    self.should_apply = should_apply
    # DynamicLossScale decides from gradients: hand it one number that is
    # finite exactly when every gradient of the step is.
    flag = tf.where(should_apply, 0.0, np.inf)
    update_op, _ = self._loss_scale.update([flag])
    count = self.skipped.assign_add(tf.cast(tf.logical_not(should_apply),
                                            tf.int64))
    return tf.group(update_op, count, name="update_loss_scale")

  def summarize(self) -> None:
    tf1.summary.scalar("loss_scale", self.value)
    tf1.summary.scalar("skipped_updates", self.skipped.read_value())

  def hook(self, output_dir: Optional[str]) -> "LossScaleHook":
    return LossScaleHook(self.should_apply, self.value, output_dir)


def for_graph(mixed_precision: Optional[str], mode: str,
              device: Optional[str]) -> Optional[LossScaling]:
  """float16 training's loss scale, on the aggregation `device`; else None."""
  if mixed_precision != "float16" or mode != tf.estimator.ModeKeys.TRAIN:
    return None
  return LossScaling(device)


class SkipNonFinite(chain.UpdateStep):
  """The update chain's decision: apply the step's update only if every
  gradient of it (every tower's, every micro-batch's) is finite; the
  loss-scale update, its summaries and `LossScaleHook` go with the spec."""

  name = "skip_nonfinite"

  def __init__(self, scaling: LossScaling, device: Optional[str],
               micro_batches: Any = None):
    """`micro_batches`: the chain's `accumulation.Accumulate` step, which
    counts non-finite micro-batches over the update; None: one batch."""
    self.scaling = scaling
    self.device = device
    self._micro_batches = micro_batches
    self._update: Optional[tf.Operation] = None

  def prepare(self, towers: list) -> None:
    with tf.device(self.device):
      finite = all_finite(towers)
      if self._micro_batches is not None:
        finite = self._micro_batches.in_every_micro_batch(
            "nonfinite_micro_batches", finite)
      self._update = self.scaling.update(finite)

  def apply_if(self, call: Any) -> Optional[tf.Tensor]:
    del call
    return self.scaling.should_apply

  def finish(self, spec, towers: list, output_dir: Optional[str]):
    del towers
    with tf.device(self.device):
      train_op = tf.group(spec.train_op, self._update)
      self.scaling.summarize()
      hooks = list(spec.training_hooks) + [self.scaling.hook(output_dir)]
    return spec._replace(train_op=train_op, training_hooks=hooks)


class Unscale(chain.UpdateStep):
  """The update chain's unscale: the gradients ÷ the loss scale."""

  name = "unscale"

  def __init__(self, scaling: LossScaling):
    self.scaling = scaling

  def transform(self, update: Any) -> list:
    return self.scaling.unscale(update.grads_and_vars)


def _make_local(variables: list) -> None:
  """Moves variables from GLOBAL_VARIABLES to LOCAL_VARIABLES."""
  graph = tf1.get_default_graph()
  global_ref = graph.get_collection_ref(tf1.GraphKeys.GLOBAL_VARIABLES)
  for variable in variables:
    if variable in global_ref:
      global_ref.remove(variable)
    graph.add_to_collection(tf1.GraphKeys.LOCAL_VARIABLES, variable)


def _times(grad, factor):
  if grad is None:
    return None
  if isinstance(grad, tf.IndexedSlices):
    return tf.IndexedSlices(grad.values * tf.cast(factor, grad.values.dtype),
                            grad.indices, grad.dense_shape)
  return grad * tf.cast(factor, grad.dtype)


def all_finite(towers: list) -> tf.Tensor:
  """Whether every gradient every tower recorded is finite (each checked on
  its tower's device)."""
  checks = []
  for tower in towers:
    for call in tower.optimizer_calls:
      for grad, _ in call.grads_and_vars:
        if grad is not None:
          values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
          with tf.device(values.device):  # only a bool leaves the tower.
            checks.append(tf.reduce_all(tf.math.is_finite(values)))
  return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


class LossScaleHook(tf1.train.SessionRunHook):
  """Logs every skipped float16 update and writes it to TensorBoard."""

  def __init__(self, should_apply: tf.Tensor, loss_scale: tf.Tensor,
               output_dir: Optional[str]):
    self._fetches = [should_apply, loss_scale]
    self._output_dir = output_dir
    self._skipped = 0

  def begin(self):
    self._global_step = tf1.train.get_global_step()
    self._writer = (tf1.summary.FileWriterCache.get(self._output_dir)
                    if self._output_dir else None)

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs(self._fetches + [self._global_step])

  def after_run(self, run_context, run_values):
    applied, scale, step = run_values.results
    if applied:
      return
    self._skipped += 1
    logging.warning(
        "Step %d: float16 gradients are not finite at loss scale %g; the "
        "update was skipped (%d so far) and the loss scale is now %g.",
        step + 1, scale, self._skipped, max(scale / 2, 1.0))
    if self._writer is not None:
      self._writer.add_summary(tf1.Summary(value=[tf1.Summary.Value(
          tag="loss_scale_skipped_update", simple_value=scale)]), step + 1)
    if scale <= 1.0:
      raise NonFiniteGradientsError(
          f"Step {step + 1}: the gradients are Inf or NaN even at loss scale "
          "1, so float16 cannot represent them: the model diverged or its "
          "values exceed float16's range (65504). Lower the learning rate, "
          "or use mixed_precision='bfloat16' or None.")
