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
from estimator_multigpu.graph.global_batch import state as global_batch
from estimator_multigpu.update import clipping
from estimator_multigpu.update import triggers

tf1 = tf.compat.v1


def tower_gradients(tower, loss, compute) -> list:
  """`compute(loss)` in `tower`: the gradients of its (scaled) loss.

  The loss is the float32, loss-scaled one with mixed precision. The
  gradients are built without the control dependencies around the call
  (see `TowerOptimizer.compute_gradients`); tower 0 keeps them for its
  train op. Inside a `tf.cond` branch the loss is differentiated outside the
  cond (`triggers`). Replicated copies come back as tower 0's variables.

  Args:
    tower: the `towers.Tower` being built.
    loss: the tower's loss.
    compute: `loss -> [(gradient, variable)]`, the wrapped optimizer's.
  """
  branch = triggers.current_branch()
  if branch is not None:  # differentiated outside the tf.cond.
    loss = triggers.outer_tensor(branch, loss)
  elif tower.index == 0:  # the scope's control inputs, for the train op.
    tower.deferred_dependencies.append(
        tf.no_op(name="control_dependencies_of_compute_gradients"))
  with triggers.outside(branch), tf.control_dependencies(None):
    loss = global_batch.tower_loss(loss)  # counted once by the combination.
    loss = precision.scale_loss(loss)  # float32 (× loss scale: float16)
    grads_and_vars = list(compute(loss))
  grads_and_vars = _as_tower0_variables(tower, grads_and_vars)
  ids = {id(t) for g, _ in grads_and_vars if g is not None
         for t in (g, getattr(g, "values", g))}
  tower.loss_scaled_gradients.update(ids)
  if branch is not None:
    tower.branch_gradients.update(ids)
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
  grads_and_vars = list(grads_and_vars)
  branch = triggers.current_branch()
  if branch is not None:
    triggers.check_computed_outside(grads_and_vars, tower.branch_gradients)
  if precision.loss_scaling_active():
    _check_loss_scaled(tower, grads_and_vars)
  computed = frozenset(tower.loss_scaled_gradients)
  if tower.num_towers > 1:
    clipping.warn_if_transformed(grads_and_vars, computed)
    clipping.warn_if_noisy(grads_and_vars, computed)
  shape = clipping.signature(grads_and_vars, computed)
  with _outside_control_dependencies(tower), triggers.outside(branch), \
      tf.name_scope("tower_weight"):
    weighted = [(_scale(g, tower.loss_weight), v) for g, v in grads_and_vars]
  recorded = tf.no_op(name="recorded_for_tower_aggregation")
  tower.optimizer_calls.append(towers_lib.OptimizerCall(
      optimizer, weighted, global_step, name, tf1.get_variable_scope(),
      tf1.get_default_graph().get_name_scope(), recorded, branch, shape))
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


def _as_tower0_variables(tower, grads_and_vars: list) -> list:
  """Tower i's copies -> tower 0's variables, in the pairs returned."""
  if tower.index == 0 or not tower.local_variables:
    return grads_and_vars
  originals = {id(copy): copy._original  # pylint: disable=protected-access
               for copy in tower.local_variables.values()
               if getattr(copy, "_original", None) is not None}
  return [(g, originals.get(id(v), v)) for g, v in grads_and_vars]


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
