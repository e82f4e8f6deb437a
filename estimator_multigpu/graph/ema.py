"""Exponential moving average (EMA) of the weights, for training and serving.

After every optimizer step, each averaged variable `w` updates its shadow
`w/ExponentialMovingAverage` (TensorFlow's own name, so tf-slim-style
`variables_to_restore()` tools read it):

    decay_t = min(ema_decay, (1 + t) / (10 + t))    # t = global step after the step
    shadow  = decay_t * shadow + (1 - decay_t) * w

The shadow starts at `w`'s initial value. EVAL, PREDICT and export then load
the shadow values into the model's own variables through the scaffold's
`Saver`, so the graph is the unwrapped one and Keras layers need no special
handling.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

tf1 = tf.compat.v1

_MOVING_STATISTICS = ("moving_mean", "moving_variance")


def averaged_variables() -> list:
  """The variables of the default graph that `multi_gpu` keeps a moving
  average of (each with a `<name>/ExponentialMovingAverage` shadow in its
  checkpoints): the trainable variables plus batch norm's moving statistics,
  in graph order."""
  candidates = (tf1.trainable_variables() + tf1.moving_average_variables() +
                [v for v in tf1.global_variables()
                 if v.op.name.rsplit("/", 1)[-1] in _MOVING_STATISTICS])
  unique, seen = [], set()
  for variable in candidates:
    if variable.op.name not in seen:
      seen.add(variable.op.name)
      unique.append(variable)
  return unique


def _moving_average(decay: float) -> tf1.train.ExponentialMovingAverage:
  return tf1.train.ExponentialMovingAverage(
      decay, num_updates=tf1.train.get_or_create_global_step())


def apply_after(train_op: tf.Operation, decay: float,
                device: Optional[str],
                applied: Optional[tf.Tensor] = None) -> tf.Operation:
  """Returns an op that runs `train_op`, then updates the shadow variables.

  With `applied` (a boolean tensor: float16 loss scaling), a step whose
  update was skipped leaves the shadows unchanged (decay_t = 1).
  """
  with tf.device(device), tf.control_dependencies([train_op]):
    if applied is None:
      average = _moving_average(decay)
    else:
      step = tf.cast(tf1.train.get_or_create_global_step(), tf.float32)
      decay_t = tf.minimum(decay, (1.0 + step) / (10.0 + step))
      average = tf1.train.ExponentialMovingAverage(
          tf.where(applied, decay_t, 1.0))
    return tf.group(average.apply(averaged_variables()),
                    name="train_op_with_ema")


def restoring_scaffold(scaffold: Optional[tf1.train.Scaffold],
                       decay: float) -> tf1.train.Scaffold:
  """A scaffold whose saver loads the shadow values into the variables.

  Raises:
    ValueError: the model_fn's scaffold already has a saver.
  """
  scaffold = scaffold or tf1.train.Scaffold()
  if scaffold.saver is not None:
    raise ValueError(
        "The model_fn's Scaffold sets a `saver`, but `multi_gpu(ema_decay=...)`"
        " needs its own saver to load the averaged weights for EVAL, PREDICT "
        "and export. Remove the saver, or pass use_ema_weights=False.")
  names = _moving_average(decay).variables_to_restore(averaged_variables())
  return tf1.train.Scaffold(saver=tf1.train.Saver(names, sharded=True),
                            copy_from_scaffold=scaffold)


def finish_spec(spec: tf.estimator.EstimatorSpec, training: bool,
                decay: Optional[float], use_ema_weights: bool,
                device: Optional[str], applied: Optional[tf.Tensor] = None
                ) -> tf.estimator.EstimatorSpec:
  """`spec` with the EMA update after its train_op (`training`), or the
  saver loading the averaged weights (EVAL, PREDICT, export, with
  `use_ema_weights`); unchanged when `decay` is None.

  `applied` (float16 training): whether the step's update was applied; a
  skipped update leaves the average unchanged too.
  """
  if decay is None:
    return spec
  if training:
    return spec._replace(train_op=apply_after(spec.train_op, decay, device,
                                              applied))
  if not use_ema_weights:
    return spec
  return spec._replace(scaffold=restoring_scaffold(spec.scaffold, decay))
