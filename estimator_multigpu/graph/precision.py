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

float16 adds dynamic loss scaling (`update.loss_scaling`): the towers
differentiate loss × scale (`scale_loss`); the update chain unscales the
combined gradients and skips a step whose gradients are not finite, with one
decision for every tower, every optimizer call and every micro-batch, as
TensorFlow's `MixedPrecisionLossScaleOptimizer` does for one replica.

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

import tensorflow as tf

tf1 = tf.compat.v1

DTYPES = {"bfloat16": tf.bfloat16, "float16": tf.float16}
_LOW = frozenset(DTYPES.values())
_STATE = threading.local()


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
  scale = precision.loss_scale
  return loss if scale is None else loss * scale


def loss_scaling_active() -> bool:
  """Whether the tower being built scales its loss (float16)."""
  precision = getattr(_STATE, "precision", None)
  return precision is not None and precision.loss_scale is not None


class Precision:
  """What `mixed_precision` does to the towers of one graph."""

  def __init__(self, name: str, loss_scale: Optional[tf.Tensor] = None):
    """`name`: "bfloat16" or "float16"; `loss_scale`: with float16
    training, the step's loss scale (`update.loss_scaling`), which the
    towers multiply their loss by before differentiating."""
    self.name = name
    self.dtype = DTYPES[name]
    self.loss_scale = loss_scale

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
