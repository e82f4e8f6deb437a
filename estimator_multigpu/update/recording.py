"""What a tower does with its gradients: take them, weight them, record them.

Shared by `tower_optimizer.TowerOptimizer` and
`keras_optimizer.KerasTowerOptimizer`. Inside a tower, `tower_gradients`
differentiates the tower's (mixed-precision scaled) loss outside the control
dependencies around the call, and `record` scales the gradients by the
tower's share of the global batch (`towers.Tower.loss_weight`), once,
whatever computed them, and records the call for the update chain.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from estimator_multigpu.graph import precision
from estimator_multigpu.graph import towers as towers_lib
from estimator_multigpu.update import clipping

tf1 = tf.compat.v1


def tower_gradients(tower, loss, compute) -> list:
  """`compute(loss)` in `tower`: the gradients of its (scaled) loss.

  The loss is the float32, loss-scaled one with mixed precision. The
  gradients are built without the control dependencies around the call
  (see `TowerOptimizer.compute_gradients`); tower 0 keeps them for its
  train op.

  Args:
    tower: the `towers.Tower` being built.
    loss: the tower's loss.
    compute: `loss -> [(gradient, variable)]`, the wrapped optimizer's.
  """
  loss = precision.scale_loss(loss)  # float32 (× loss scale: float16)
  if tower.index == 0:  # the scope's control inputs, for the train op.
    tower.deferred_dependencies.append(
        tf.no_op(name="control_dependencies_of_compute_gradients"))
  with tf.control_dependencies(None):
    grads_and_vars = list(compute(loss))
  tower.loss_scaled_gradients.update(
      id(t) for g, _ in grads_and_vars if g is not None
      for t in (g, getattr(g, "values", g)))
  return grads_and_vars


def record(optimizer, tower, grads_and_vars, global_step=None,
           name=None) -> tf.Operation:
  """Records `tower`'s gradients, weighted by its share; returns a no-op.

  Args:
    optimizer: the wrapper whose `apply_combined` applies them later.
    tower: the `towers.Tower` being built.
    grads_and_vars: the tower's `(gradient, variable)` pairs.
    global_step: what the combined apply increments (None: nothing).
    name: the apply's name.
  """
  _check_not_in_a_function()
  grads_and_vars = list(grads_and_vars)
  if precision.loss_scaling_active():
    _check_loss_scaled(tower, grads_and_vars)
  if tower.num_towers > 1:
    clipping.warn_if_transformed(
        grads_and_vars, frozenset(tower.loss_scaled_gradients))
  with _outside_control_dependencies(tower), tf.name_scope("tower_weight"):
    weighted = [(_scale(g, tower.loss_weight), v) for g, v in grads_and_vars]
  recorded = tf.no_op(name="recorded_for_tower_aggregation")
  tower.optimizer_calls.append(towers_lib.OptimizerCall(
      optimizer, weighted, global_step, name, tf1.get_variable_scope(),
      tf1.get_default_graph().get_name_scope(), recorded))
  return recorded


def _check_loss_scaled(tower, grads_and_vars: list) -> None:
  """With float16 loss scaling, the gradients must be of the scaled loss.

  The update divides them by the loss scale, so gradients computed another
  way (`tf.gradients`, the inner optimizer, or transformed after
  `compute_gradients`, e.g. clipped) would be silently too small.
  """
  foreign = [v.op.name for g, v in grads_and_vars
             if g is not None and id(g) not in tower.loss_scaled_gradients]
  if foreign:
    raise ValueError(
        "mixed_precision='float16' scales the loss before differentiating "
        "and unscales the combined gradients, but the gradients passed to "
        f"`apply_gradients` for {', '.join(foreign[:3])}"
        f"{' ...' if len(foreign) > 3 else ''} did not come straight from "
        "`TowerOptimizer.compute_gradients` (tf.gradients, the inner "
        "optimizer, or clipped afterwards). Use opt.minimize(loss) or pass "
        "compute_gradients' output unchanged (clip with "
        "multi_gpu(clip_gradients_by_norm=...)), or use "
        "mixed_precision='bfloat16', which needs no loss scaling.")


def _check_not_in_a_function() -> None:
  """Recording happens in the tower's graph, not inside a `tf.cond` branch
  (`MixedPrecisionLossScaleOptimizer` applies inside one)."""
  if tf1.get_default_graph().building_function:
    raise ValueError(
        "`TowerOptimizer.apply_gradients` was called inside a tf.cond or "
        "tf.function: an optimizer wraps the TowerOptimizer and applies "
        "conditionally (MixedPrecisionLossScaleOptimizer(TowerOptimizer(opt))"
        " does). Wrap the other way round, TowerOptimizer("
        "MixedPrecisionLossScaleOptimizer(opt, loss_scale)), so the loss "
        "scale decides once for the combined gradients; or use "
        "multi_gpu(mixed_precision='float16').")


def _outside_control_dependencies(tower):
  """In towers 1.., no control dependencies (their UPDATE_OPS must not run)."""
  return (tf.control_dependencies(None) if tower.index else
          contextlib.nullcontext())


def _scale(grad, weight):
  """grad * weight, and 0 where weight is 0 even if grad is NaN or Inf."""
  if grad is None or (isinstance(weight, float) and weight == 1.0):
    return grad
  if isinstance(grad, tf.IndexedSlices):
    return tf.IndexedSlices(
        tf.math.multiply_no_nan(grad.values,
                                tf.cast(weight, grad.values.dtype)),
        grad.indices, grad.dense_shape)
  return tf.math.multiply_no_nan(grad, tf.cast(weight, grad.dtype))
