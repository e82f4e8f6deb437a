"""`TowerOptimizer`: records each tower's gradients; applies the combined ones.

Inside a tower, `TowerOptimizer.apply_gradients` (and so `minimize`) records
the gradients it is given, scaled by the tower's share of the global batch,
and returns a no-op. The scaling happens there, whatever computed the
gradients: `TowerOptimizer.compute_gradients`, the wrapped optimizer's,
`tf.gradients`, a custom path, clipped or not. So a tower's gradients count
once, with the right weight; clipping inside the model_fn clips each tower's
own (mean) gradient before it is weighted. Once every tower is built, the
update chain (`update.chain`) combines the recorded gradients through the
plan's strategy and `apply_combined` applies them once per step.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import tensorflow as tf

from estimator_multigpu.graph import precision
from estimator_multigpu.graph import towers as towers_lib
from estimator_multigpu.strategies import base
from estimator_multigpu.update import clipping
from estimator_multigpu.update import triggers
tf1 = tf.compat.v1

# Names of the SyncReplicasOptimizers that applied gradients in this graph
# (read by `multi_gpu` to update the moving average on the chief only).
SYNC_REPLICAS_COLLECTION = "estimator_multigpu_sync_replicas"


class TowerOptimizer(tf1.train.Optimizer):
  """Wraps a `tf.compat.v1.train.Optimizer` for use inside `multi_gpu`.

  Outside `multi_gpu`, or with one tower, it behaves exactly like the
  optimizer it wraps. With several towers, each tower's `minimize` (or
  `compute_gradients` + `apply_gradients`) records the tower's gradients and
  returns a no-op; the wrapper applies the combined gradients once per step.
  Several optimizers and several losses are matched across towers by call
  order. Any other attribute (e.g. `SyncReplicasOptimizer`'s
  `make_session_run_hook`) is the wrapped optimizer's.
  """

  def __init__(self, optimizer: tf1.train.Optimizer,
               summarize_gradient_norm: bool = False):
    """Wraps `optimizer`.

    Args:
      optimizer: the `tf.compat.v1.train.Optimizer` to apply gradients with.
      summarize_gradient_norm: write a `gradient_global_norm` summary of the
        gradients applied (the combined ones, with several towers).

    Raises:
      TypeError: `optimizer` is not a `tf.compat.v1.train.Optimizer` (a
        `TowerOptimizer` is unwrapped: wrapping twice is wrapping once).
    """
    if isinstance(optimizer, TowerOptimizer):  # Wrapping twice: once.
      summarize_gradient_norm |= optimizer._summarize_gradient_norm  # pylint: disable=protected-access
      optimizer = optimizer._optimizer  # pylint: disable=protected-access
    if not isinstance(optimizer, tf1.train.Optimizer):
      raise TypeError(
          "`TowerOptimizer` wraps a `tf.compat.v1.train.Optimizer` (e.g. "
          f"MomentumOptimizer); got {type(optimizer).__name__}. Keras "
          "optimizers are not supported by Estimator model_fns.")
    super().__init__(use_locking=False, name=f"Tower{optimizer.get_name()}")
    self._optimizer = optimizer
    self._summarize_gradient_norm = summarize_gradient_norm

  def __getattr__(self, name):
    optimizer = self.__dict__.get("_optimizer")
    if optimizer is None:
      raise AttributeError(name)
    return getattr(optimizer, name)

  def compute_gradients(self, loss, var_list=None, **kwargs):
    """The wrapped optimizer's gradients of the tower's loss (not yet scaled).

    `apply_gradients` scales them by the tower's share of the global batch.
    The gradients are built without the control dependencies around the
    call (usually the tower's UPDATE_OPS, from the common
    `with tf.control_dependencies(update_ops): opt.minimize(loss)`). In
    towers 1.. they are dropped: only tower 0's batch-norm statistics update
    the moving averages. In tower 0 the train op still runs them
    (`Tower.deferred_dependencies`), but the gradient ops don't wait for
    them: inside the scope every gradient op without data inputs (thousands
    of constants) got one control edge per update op, 313,000 edges on
    ResNet-50, which Grappler's dependency optimizer took 37 s to prune.
    """
    tower = towers_lib.current_tower()
    if tower is None:
      return self._optimizer.compute_gradients(loss, var_list, **kwargs)
    var_list = _tower_var_list(tower, var_list)
    branch = triggers.current_branch()
    if branch is not None:  # differentiated outside the tf.cond.
      loss = triggers.outer_tensor(branch, loss)
    elif tower.index == 0:  # the scope's control inputs, for the train op.
      tower.deferred_dependencies.append(
          tf.no_op(name="control_dependencies_of_compute_gradients"))
    kwargs["colocate_gradients_with_ops"] = True
    with triggers.outside(branch), tf.control_dependencies(None):
      loss = precision.scale_loss(loss)  # float32 (× loss scale: float16)
      grads_and_vars = self._optimizer.compute_gradients(loss, var_list,
                                                         **kwargs)
    grads_and_vars = _as_tower0_variables(tower, grads_and_vars)
    ids = {id(t) for g, _ in grads_and_vars if g is not None
           for t in (g, getattr(g, "values", g))}
    tower.loss_scaled_gradients.update(ids)
    if branch is not None:
      tower.branch_gradients.update(ids)
    return grads_and_vars

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    """Records the tower's gradients, weighted; outside a tower, applies them.

    Whatever computed the gradients, they are scaled here by the tower's
    share of the global batch (`towers.Tower.loss_weight`), once.
    """
    tower = towers_lib.current_tower()
    if tower is None:
      return self.apply_combined(grads_and_vars, global_step, name)
    grads_and_vars = list(grads_and_vars)
    branch = triggers.current_branch()
    if branch is not None:
      triggers.check_computed_outside(grads_and_vars, tower.branch_gradients)
    if precision.loss_scaling_active():
      _check_loss_scaled(tower, grads_and_vars)
    if tower.num_towers > 1:
      computed = frozenset(tower.loss_scaled_gradients)
      clipping.warn_if_transformed(grads_and_vars, computed)
      clipping.warn_if_noisy(grads_and_vars, computed)
    shape = clipping.signature(grads_and_vars,
                               frozenset(tower.loss_scaled_gradients))
    with _outside_control_dependencies(tower), triggers.outside(branch), \
        tf.name_scope("tower_weight"):
      weighted = [(_scale(g, tower.loss_weight), v) for g, v in grads_and_vars]
    recorded = tf.no_op(name="recorded_for_tower_aggregation")
    tower.optimizer_calls.append(towers_lib.OptimizerCall(
        self, weighted, global_step, name, tf1.get_variable_scope(),
        tf1.get_default_graph().get_name_scope(), recorded, branch, shape))
    return recorded

  @property
  def wrapped(self) -> tf1.train.Optimizer:
    """The optimizer this one wraps."""
    return self._optimizer

  def apply_combined(self, grads_and_vars, global_step=None, name=None,
                     apply_if: Optional[tf.Tensor] = None):
    """Applies gradients that cover the whole global batch.

    With `apply_if` (a scalar bool), the wrapped optimizer's apply, and the
    `global_step` increment with it, run only when it is True.
    """
    grads_and_vars = list(grads_and_vars)
    if self._summarize_gradient_norm:
      tf1.summary.scalar("gradient_global_norm", tf.linalg.global_norm(
          [g for g, _ in grads_and_vars if g is not None]))
    if isinstance(self._optimizer, tf1.train.SyncReplicasOptimizer):
      tf1.add_to_collection(SYNC_REPLICAS_COLLECTION,
                            self._optimizer.get_name())
    return base.applied_if(apply_if, lambda: self._optimizer.apply_gradients(
        grads_and_vars, global_step, name))

  def get_slot(self, *args, **kwargs):
    return self._optimizer.get_slot(*args, **kwargs)

  def get_slot_names(self, *args, **kwargs):
    return self._optimizer.get_slot_names(*args, **kwargs)

  def variables(self):
    return self._optimizer.variables()


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


def _tower_var_list(tower, var_list):
  """Replicated variables: tower 0's `var_list` of this call (by call order),
  as tower `tower`'s copies. Tower 0 records its own."""
  if tower.index == 0:
    tower.var_lists.append(var_list)
    return var_list
  if not tower.local_variables:
    return var_list
  position = len(tower.var_lists)
  tower.var_lists.append(var_list)
  tower0_list = tower.tower0_var_lists[position] if position < len(
      tower.tower0_var_lists) else var_list
  if tower0_list is None:
    return None
  return [tower.local_variables.get(getattr(v, "op", v).name, v)
          for v in tf.nest.flatten(tower0_list)]


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
