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

from typing import Optional

import tensorflow as tf

from estimator_multigpu.graph import towers as towers_lib
from estimator_multigpu.strategies import base
from estimator_multigpu.update import clipping
from estimator_multigpu.update import keras_optimizer
from estimator_multigpu.update import recording

tf1 = tf.compat.v1

# Names of the SyncReplicasOptimizers that applied gradients in this graph
# (read by `multi_gpu` to update the moving average on the chief only).
SYNC_REPLICAS_COLLECTION = "estimator_multigpu_sync_replicas"


class TowerOptimizer(tf1.train.Optimizer):
  """Wraps an optimizer for use inside `multi_gpu`.

  A `tf.compat.v1.train.Optimizer` gets this class; a Keras 2 legacy one
  (`tf.keras.optimizers.legacy.*`) gets `keras_optimizer.KerasTowerOptimizer`,
  which records and applies the same way.

  Outside `multi_gpu`, or with one tower, it behaves exactly like the
  optimizer it wraps. With several towers, each tower's `minimize` (or
  `compute_gradients` + `apply_gradients`) records the tower's gradients and
  returns a no-op; the wrapper applies the combined gradients once per step.
  Several optimizers and several losses are matched across towers by call
  order. Any other attribute (e.g. `SyncReplicasOptimizer`'s
  `make_session_run_hook`) is the wrapped optimizer's.
  """

  def __new__(cls, optimizer=None, summarize_gradient_norm: bool = False):
    """A Keras legacy optimizer gets `keras_optimizer.KerasTowerOptimizer`."""
    if optimizer is None or is_v1_optimizer(optimizer):
      return super().__new__(cls)
    if keras_optimizer.is_legacy_keras(optimizer):
      return keras_optimizer.KerasTowerOptimizer(optimizer,
                                                 summarize_gradient_norm)
    raise TypeError(keras_optimizer.not_wrappable_message(optimizer))

  def __init__(self, optimizer: tf1.train.Optimizer,
               summarize_gradient_norm: bool = False):
    """Wraps `optimizer`.

    Args:
      optimizer: the `tf.compat.v1.train.Optimizer` to apply gradients with:
        any subclass, or an object forwarding to one (tf.contrib's
        `MultitaskOptimizerWrapper`); one that never ran
        `Optimizer.__init__` (tf.contrib's `MovingAverageOptimizer`) too.
      summarize_gradient_norm: write a `gradient_global_norm` summary of the
        gradients applied (the combined ones, with several towers).

    Raises:
      TypeError: `optimizer` is neither a `tf.compat.v1.train.Optimizer`
        (nor has its `compute_gradients` and `apply_gradients`) nor a
        `tf.keras.optimizers.legacy.Optimizer` (a `TowerOptimizer` is
        unwrapped: wrapping twice is wrapping once).
    """
    if isinstance(optimizer, TowerOptimizer):  # Wrapping twice: once.
      summarize_gradient_norm |= optimizer._summarize_gradient_norm  # pylint: disable=protected-access
      optimizer = optimizer._optimizer  # pylint: disable=protected-access
    if not is_v1_optimizer(optimizer):  # None, copy.copy.
      raise TypeError("`TowerOptimizer` wraps an optimizer; got "
                      f"{optimizer!r}.")
    super().__init__(use_locking=False,
                     name=f"Tower{optimizer_name(optimizer)}")
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
    kwargs["colocate_gradients_with_ops"] = True
    grads_and_vars = recording.tower_gradients(tower, loss, lambda scaled: (
        self._optimizer.compute_gradients(scaled, var_list, **kwargs)))
    if tower.num_towers > 1:
      _refuse_nonlinear(self._optimizer, grads_and_vars)
    return grads_and_vars

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    """Records the tower's gradients, weighted; outside a tower, applies them.

    Whatever computed the gradients, they are scaled here by the tower's
    share of the global batch (`towers.Tower.loss_weight`), once.
    """
    tower = towers_lib.current_tower()
    if tower is None:
      return self.apply_combined(grads_and_vars, global_step, name)
    return recording.record(self, tower, grads_and_vars, global_step, name)

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
                            optimizer_name(self._optimizer))
    return base.applied_if(apply_if, lambda: self._optimizer.apply_gradients(
        grads_and_vars, global_step, name))

  def get_slot(self, *args, **kwargs):
    return self._optimizer.get_slot(*args, **kwargs)

  def get_slot_names(self, *args, **kwargs):
    return self._optimizer.get_slot_names(*args, **kwargs)

  def variables(self):
    return self._optimizer.variables()


def _refuse_nonlinear(optimizer, grads_and_vars: list) -> None:
  """The wrapped optimizer's `compute_gradients` may scale the gradients
  linearly (a loss scale, a factor of the variables), not transform them
  with a function of their values (a LARS trust ratio over ||g||, a clip):
  each tower's would be transformed, not the global batch's.

  Raises:
    ValueError: it does, naming the optimizer's class and the fix.
  """
  transformed = clipping.find_transformed(grads_and_vars)
  if transformed:
    name = type(optimizer).__name__
    raise ValueError(
        f"{name}.compute_gradients transforms the gradients nonlinearly (of "
        f"{', '.join(transformed[:3])}{' ...' if len(transformed) > 3 else ''}"
        ": a norm of the gradients, as in a LARS trust ratio, a clip, or "
        "another function of their values). With several towers it is "
        "called on each tower's gradient, so each would be transformed "
        "alone, where one device transforms the gradient of the whole "
        f"batch. Move the transform into {name}'s apply (_apply_dense / "
        "_resource_apply_dense, as tf.contrib.opt.LARSOptimizer does): "
        "TowerOptimizer applies once, on the combined gradients. To clip, "
        "pass multi_gpu(clip_gradients_by_norm=...).")


def is_v1_optimizer(optimizer) -> bool:
  """A `tf.compat.v1.train.Optimizer`, or an object standing for one: both
  its `compute_gradients` and `apply_gradients` (tf.contrib's
  `MultitaskOptimizerWrapper` forwards every attribute to the one it wraps),
  and not a Keras one."""
  if isinstance(optimizer, tf1.train.Optimizer):
    return True
  if optimizer is None or keras_optimizer.is_keras(optimizer):
    return False
  return all(callable(getattr(optimizer, method, None))
             for method in ("compute_gradients", "apply_gradients"))


def optimizer_name(optimizer) -> str:
  """`optimizer.get_name()`; its class's name for a wrapper that never ran
  `Optimizer.__init__` (tf.contrib's `MovingAverageOptimizer` has no
  `_name`)."""
  try:
    return optimizer.get_name()
  except AttributeError:
    return type(optimizer).__name__.lstrip("_")


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
