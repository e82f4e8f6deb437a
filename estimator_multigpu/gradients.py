"""Gradients: `TowerOptimizer` records each tower's, the plan combines them.

Inside a tower, `TowerOptimizer.apply_gradients` (and so `minimize`) records
the gradients it is given, scaled by the tower's share of the global batch,
and returns a no-op. The scaling happens there, whatever computed the
gradients: `TowerOptimizer.compute_gradients`, the wrapped optimizer's,
`tf.gradients`, a custom path, clipped or not. So a tower's gradients count
once, with the right weight; clipping inside the model_fn clips each tower's
own (mean) gradient before it is weighted. Once every tower is built,
`apply_tower_gradients` sums the recorded gradients per variable on the
aggregation device (`IndexedSlices` stay sparse, `None` is skipped),
optionally clips them by global norm, and applies them once with the wrapped
optimizer, so `global_step` moves once per step.
"""

from __future__ import annotations

import contextlib
from typing import Optional

from absl import logging
import tensorflow as tf

from estimator_multigpu import mixed_precision
from estimator_multigpu import towers as towers_lib

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
    if var_list is not None and tower.local_variables:
      var_list = [tower.local_variables.get(getattr(v, "op", v).name, v)
                  for v in tf.nest.flatten(var_list)]
    loss = mixed_precision.scale_loss(loss)  # float32 (× loss scale: float16)
    kwargs["colocate_gradients_with_ops"] = True
    if tower.index == 0:  # the scope's control inputs, for the train op.
      tower.deferred_dependencies.append(
          tf.no_op(name="control_dependencies_of_compute_gradients"))
    with tf.control_dependencies(None):
      grads_and_vars = self._optimizer.compute_gradients(loss, var_list,
                                                         **kwargs)
    tower.loss_scaled_gradients.update(id(g) for g, _ in grads_and_vars)
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
    if mixed_precision.loss_scaling_active():
      _check_loss_scaled(tower, grads_and_vars)
    if tower.num_towers > 1:
      warn_if_clipped_by_global_norm([g for g, _ in grads_and_vars])
    with _outside_control_dependencies(tower), tf.name_scope("tower_weight"):
      weighted = [(_scale(g, tower.loss_weight), v) for g, v in grads_and_vars]
    tower.optimizer_calls.append(towers_lib.OptimizerCall(
        self, weighted, global_step, name,
        tf1.get_variable_scope(), tf1.get_default_graph().get_name_scope()))
    return tf.no_op(name="recorded_for_tower_aggregation")

  def apply_combined(self, grads_and_vars, global_step=None, name=None):
    """Applies gradients that cover the whole global batch."""
    grads_and_vars = list(grads_and_vars)
    if self._summarize_gradient_norm:
      tf1.summary.scalar("gradient_global_norm", tf.linalg.global_norm(
          [g for g, _ in grads_and_vars if g is not None]))
    if isinstance(self._optimizer, tf1.train.SyncReplicasOptimizer):
      tf1.add_to_collection(SYNC_REPLICAS_COLLECTION,
                            self._optimizer.get_name())
    return self._optimizer.apply_gradients(grads_and_vars, global_step, name)

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


def _outside_control_dependencies(tower):
  """In towers 1.., no control dependencies (their UPDATE_OPS must not run)."""
  return (tf.control_dependencies(None) if tower.index else
          contextlib.nullcontext())


_CLIP_SCOPE = "clip_by_global_norm"
_WARNED: set = set()


def warn_if_clipped_by_global_norm(grads: list) -> bool:
  """Warns once when a tower's gradients come from `tf.clip_by_global_norm`.

  Returns:
    Whether the gradients look clipped by global norm (an output of the ops
    `tf.clip_by_global_norm` names after itself, as Google BERT's
    `optimization.py` and `tf_slim.optimize_loss(clip_gradients=...)` use).
  """
  clipped = any(_CLIP_SCOPE in _producer_name(g) for g in grads
                if g is not None)
  if clipped and _CLIP_SCOPE not in _WARNED:
    _WARNED.add(_CLIP_SCOPE)
    logging.warning(
        "multi_gpu: the model_fn clips its gradients by global norm "
        "(tf.clip_by_global_norm) inside each tower, so each tower's own "
        "gradient is clipped before the towers are combined; one device "
        "clips the gradient of the whole batch. To clip exactly as on one "
        "device, remove the clip from the model_fn and pass "
        "multi_gpu(..., clip_gradients_by_norm=<the same norm>).")
  return clipped


def _producer_name(grad) -> str:
  values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
  return getattr(getattr(values, "op", None), "name", "")


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


def apply_tower_gradients(towers: list, aggregation_device: Optional[str],
                          clip_norm: Optional[float]) -> list:
  """Applies every recorded optimizer call once, with combined gradients.

  Args:
    towers: the built towers; their `optimizer_calls` must line up.
    aggregation_device: where gradients are summed and applied.
    clip_norm: if set, clip the combined gradients to this global norm.

  Returns:
    The apply ops, one per optimizer call of tower 0.

  Raises:
    ValueError: towers made different numbers of calls, or their variable
      lists differ.
  """
  check_call_counts(towers)
  ops = []
  for position, first_call in enumerate(towers[0].optimizer_calls):
    calls = [tower.optimizer_calls[position] for tower in towers]
    with tf.device(aggregation_device), tf.name_scope("tower_gradients"):
      grads_and_vars = sum_tower_gradients(
          [call.grads_and_vars for call in calls])
      if clip_norm is not None:
        grads_and_vars = clip_by_global_norm(grads_and_vars, clip_norm)
    with tf.device(aggregation_device), first_call.scopes():
      ops.append(first_call.optimizer.apply_combined(
          grads_and_vars, first_call.global_step, first_call.name))
  return ops


def check_call_counts(towers: list) -> None:
  counts = [len(tower.optimizer_calls) for tower in towers]
  if len(set(counts)) > 1:
    raise ValueError(
        "Towers called `TowerOptimizer.apply_gradients` (or `minimize`) "
        f"different numbers of times: {counts} (tower 0 first). The model_fn "
        "must make the same optimizer calls, in the same order, in every tower.")


def sum_tower_gradients(tower_grads: list) -> list:
  """Sums per-variable gradients over towers.

  Args:
    tower_grads: per tower, a list of `(gradient, variable)` pairs over the
      same variables in the same order.

  Returns:
    One list of `(gradient, variable)`; a gradient is None when every tower's
    is None, `IndexedSlices` when every tower's is.
  """
  check_variables_line_up(tower_grads)
  combined = []
  for pairs in zip(*tower_grads):
    grads = [g for g, _ in pairs if g is not None]
    combined.append((_sum(grads), pairs[0][1]))
  missing = [v.op.name for g, v in combined if g is None]
  if missing:
    logging.warning("multi_gpu: no gradient for %d variable(s): %s",
                    len(missing), ", ".join(missing))
  return combined


def _sum(grads: list):
  if not grads:
    return None
  if len(grads) == 1:
    return grads[0]
  if all(isinstance(g, tf.IndexedSlices) for g in grads):
    return tf.IndexedSlices(tf.concat([g.values for g in grads], axis=0),
                            tf.concat([g.indices for g in grads], axis=0),
                            grads[0].dense_shape)
  return tf.math.add_n([tf.convert_to_tensor(g) for g in grads])


def check_variables_line_up(tower_grads: list) -> None:
  reference = [v for _, v in tower_grads[0]]
  for index, pairs in enumerate(tower_grads[1:], start=1):
    variables = [v for _, v in pairs]
    if variables != reference:
      only_0 = sorted({v.op.name for v in reference} -
                      {v.op.name for v in variables})
      only_i = sorted({v.op.name for v in variables} -
                      {v.op.name for v in reference})
      logging.error("multi_gpu: tower 0 vs tower %d variables differ: only "
                    "in tower 0: %s; only in tower %d: %s",
                    index, only_0, index, only_i)
      raise ValueError(
          f"Tower {index} computed gradients for different variables than "
          f"tower 0 (only in tower 0: {only_0 or 'none'}; only in tower "
          f"{index}: {only_i or 'none'}; or a different order). Every tower "
          "must call the optimizer on the same variables.")


def clip_by_global_norm(grads_and_vars: list, clip_norm: float) -> list:
  """Clips the gradients (None skipped) to a global norm of `clip_norm`."""
  present = [(g, v) for g, v in grads_and_vars if g is not None]
  clipped, _ = tf.clip_by_global_norm([g for g, _ in present], clip_norm)
  by_variable = {id(v): g for (_, v), g in zip(present, clipped)}
  return [(by_variable.get(id(v)), v) for _, v in grads_and_vars]
