"""Mixed precision: float32 master variables, low-precision math in the towers.

`multi_gpu(mixed_precision="bfloat16" | "float16")` changes only what runs
inside the towers:

- the tower's floating features (float32/float64 tensors and sparse values)
  are cast to the low precision; labels are left alone;
- a variable that `tf.compat.v1.get_variable` (tf-slim, `tf.compat.v1.layers`)
  is asked for in a low precision is created in float32 (the master copy, with
  the unwrapped name, in checkpoints) and the tower gets a cast of it: a custom
  getter, as tf_cnn_benchmarks' `--use_fp16`. Keras layers built inside the
  model_fn get TensorFlow's `mixed_<dtype>` Keras policy, which does the same;
- `TowerOptimizer` differentiates the loss cast to float32, so the gradients
  of the float32 masters are float32 and are combined, accumulated and applied
  in float32; the tower's loss and floating predictions are returned as
  float32.

float16 adds dynamic loss scaling: TensorFlow's
`tf.compat.v1.mixed_precision.DynamicLossScale` holds the scale (initially
2¹⁵) and its rule: after `increment_period` (2000) finite updates in a row the
scale doubles; on an Inf/NaN gradient it halves (not below 1) and the update is
skipped. Each tower differentiates loss × scale; the combined gradients are
divided by the scale (a power of two: exact). One decision covers every
tower, every optimizer call and, with `accumulate_steps`, every micro-batch of
the update; a skipped update moves nothing, `global_step` and the EMA
included, as with TensorFlow's `MixedPrecisionLossScaleOptimizer` (whose
`tf.cond` pattern this follows; the optimizer itself is per-optimizer and
per-replica, so it cannot make one decision for all towers). A skip is logged
as a WARNING with the step and scale, and written to TensorBoard
(`loss_scale`, `skipped_updates`). A skip at loss scale 1 means the gradients
overflow float16 without any scaling: training stops with
`NonFiniteGradientsError`. The scale is a local variable (`loss_scale/...`),
so checkpoints stay portable between precisions; each `train()` call starts
again at 2¹⁵ and backs off in a few skipped steps.

Not used: `tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite`
(deprecated) rewrites every op of the session's graph through Grappler, which
cannot be limited to the towers, and casts only on GPUs for float16.

Export (`export_saved_model`) builds the unwrapped model_fn: the SavedModel
computes in float32 with the trained masters.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Optional

from absl import logging
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

DTYPES = {"bfloat16": tf.bfloat16, "float16": tf.float16}
_LOW = frozenset(DTYPES.values())
_STATE = threading.local()


class NonFiniteGradientsError(RuntimeError):
  """float16 gradients overflow even at loss scale 1."""


def check_mixed_precision(value: Any) -> Optional[str]:
  """Validates `mixed_precision`.

  Raises:
    ValueError: not None, "bfloat16" or "float16".
  """
  if value is not None and value not in DTYPES:
    raise ValueError(
        f"`mixed_precision` is {value!r}; expected None (float32), "
        "'bfloat16' or 'float16'. bfloat16 needs no loss scaling; float16 "
        "uses a dynamic loss scale.")
  return value


def scale_loss(loss: tf.Tensor) -> tf.Tensor:
  """The loss a tower differentiates (called by `TowerOptimizer`).

  Outside a mixed-precision tower: `loss`. Inside: the loss in float32, times
  the loss scale with float16.
  """
  precision = getattr(_STATE, "precision", None)
  if precision is None:
    return loss
  loss = tf.cast(loss, tf.float32)
  scaling = precision.loss_scaling
  return loss if scaling is None else loss * scaling.value


def loss_scaling_active() -> bool:
  """Whether the tower being built scales its loss (float16)."""
  precision = getattr(_STATE, "precision", None)
  return precision is not None and precision.loss_scaling is not None


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
      _make_local(list(self._loss_scale._weights.values()) + [self.skipped])  # pylint: disable=protected-access
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


class Precision:
  """What `mixed_precision` does to the towers of one graph."""

  def __init__(self, name: str, loss_scaling: Optional[LossScaling]):
    self.name = name
    self.dtype = DTYPES[name]
    self.loss_scaling = loss_scaling

  @classmethod
  def create(cls, name: Optional[str], mode: str,
             device: Optional[str]) -> Optional["Precision"]:
    """None for float32; float16 training gets a loss scale on `device`."""
    if name is None:
      return None
    scaling = (LossScaling(device) if name == "float16" and
               mode == tf.estimator.ModeKeys.TRAIN else None)
    return cls(name, scaling)

  def cast_features(self, features: Any) -> Any:
    """Floating tensors (and sparse values) in the low precision."""
    def cast(leaf):
      if isinstance(leaf, tf.SparseTensor) and leaf.values.dtype.is_floating:
        return tf.SparseTensor(leaf.indices, tf.cast(leaf.values, self.dtype),
                               leaf.dense_shape)
      if isinstance(leaf, tf.Tensor) and leaf.dtype.is_floating:
        return tf.cast(leaf, self.dtype)
      return leaf
    return tf.nest.map_structure(cast, features)

  def finish(self, spec: tf.estimator.EstimatorSpec):
    """The tower's spec with its loss and floating predictions in float32."""
    def to_float32(value):
      if isinstance(value, tf.Tensor) and value.dtype in _LOW:
        return tf.cast(value, tf.float32)
      return value
    return spec._replace(loss=to_float32(spec.loss),
                         predictions=tf.nest.map_structure(
                             to_float32, spec.predictions))

  @contextlib.contextmanager
  def tower_scope(self, tower: Any):
    """Inside the tower: float32 masters, low-precision casts, loss scale."""
    del tower  # the same for every tower.
    scope = tf1.get_variable_scope()
    outer_getter = scope.custom_getter
    getter = _master_getter
    if outer_getter is not None:  # composed as `tf.compat.v1.variable_scope`.
      def getter(getter, *args, **kwargs):  # pylint: disable=function-redefined
        return _master_getter(functools.partial(outer_getter, getter), *args,
                              **kwargs)
    keras_policy = tf.keras.mixed_precision.global_policy()
    scope.set_custom_getter(getter)
    tf.keras.mixed_precision.set_global_policy(f"mixed_{self.name}")
    _STATE.precision = self
    try:
      yield
    finally:
      _STATE.precision = None
      tf.keras.mixed_precision.set_global_policy(keras_policy)
      scope.set_custom_getter(outer_getter)


def _master_getter(getter, *args, **kwargs):
  """Creates low-precision variables in float32; returns a cast."""
  requested = kwargs.get("dtype")
  if requested is None or tf.as_dtype(requested).base_dtype not in _LOW:
    return getter(*args, **kwargs)
  kwargs["dtype"] = tf.float32
  return tf.cast(getter(*args, **kwargs), tf.as_dtype(requested).base_dtype)


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
