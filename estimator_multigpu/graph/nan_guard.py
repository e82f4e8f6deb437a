"""A NaN loss stops the step with one message naming the non-finite inputs.

On one device Estimator's `NanTensorHook` ends training with a bare "NaN
loss during training." once the step has run. With several towers
`multi_gpu` adds one check to the train_op instead: when the loss over the
global batch is NaN, the step fails with an error (`InvalidArgumentError`,
"assertion failed") that gives how many values of each floating-point
feature and label of the global batch are NaN or Inf, and the fix. The counts are computed only on that failing step; on every other step
the check costs one `is_nan` of the loss. The newest checkpoint is the last
good one: no checkpoint is written after the failing step.

A hook that reports a NaN loss itself, with the step and the model dir's
newest checkpoint (`runtime.guards.NonFiniteLossHook`, which train.py
installs), feeds False to the tensors of `ENABLED_COLLECTION` and so turns
this check off.
"""

from __future__ import annotations

import tensorflow as tf

from estimator_multigpu import compat

nest = compat.internal("nest")
tf1 = tf.compat.v1
ENABLED_COLLECTION = "estimator_multigpu_nan_guard_enabled"

_FIX = ("Repair or drop the non-finite examples in the input_fn "
        "(tf.debugging.check_numerics finds the first); if every count "
        "is 0, the model diverged: lower the learning rate or clip the "
        "gradients (multi_gpu's clip_gradients_by_norm).")


def guard(spec: tf.estimator.EstimatorSpec, features, labels
          ) -> tf.estimator.EstimatorSpec:
  """`spec` whose train_op fails on a NaN loss, with the inputs' counts."""
  with tf.name_scope("nan_guard"):
    enabled = tf1.placeholder_with_default(True, [], name="enabled")
    tf1.add_to_collection(ENABLED_COLLECTION, enabled)
    check = tf.cond(tf.logical_and(enabled, tf.math.is_nan(spec.loss)),
                    lambda: _fail(features, labels),
                    lambda: tf.constant(True), name="loss_is_nan")
  return spec._replace(train_op=tf.group(spec.train_op, check))


def _fail(features, labels) -> tf.Tensor:
  """Fails with the message when run (the NaN branch)."""
  counts = _non_finite_counts({"features": features, "labels": labels})
  template = ("multi_gpu: the loss over the global batch is NaN. Non-finite "
              "(NaN or Inf) values in that global batch: " +
              (", ".join(f"{name} {{}} of {{}}" for name in counts) or
               "none (no floating-point input)") + ". " + _FIX)
  values = [value for pair in counts.values() for value in pair]
  message = (tf.strings.format(template, values) if values
             else tf.constant(template))
  with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
    return tf.constant(False)


def _non_finite_counts(inputs) -> dict:
  """{path: (non-finite values, values)} of every floating-point leaf."""
  counts = {}
  for path, leaf in nest.flatten_with_joined_string_paths(
      inputs, expand_composites=False):
    values = leaf.values if isinstance(leaf, tf.SparseTensor) else leaf
    if isinstance(values, tf.Tensor) and values.dtype.is_floating:
      bad = tf.logical_not(tf.math.is_finite(values))
      counts[path] = (tf.reduce_sum(tf.cast(bad, tf.int64)),
                      tf.size(values, out_type=tf.int64))
  return counts
