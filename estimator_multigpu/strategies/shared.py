""""shared": one copy of each variable on the aggregation device; one update.

tf_cnn_benchmarks' `parameter_server`, tensorpack's
`SyncMultiGPUTrainerParameterServer`. Tower 0 creates the variables (placed
on `plan.variable_device`), towers 1.. read them (`graph.sharing`). `combine`
sums the towers' weighted gradients per variable on the aggregation device
(`IndexedSlices` stay sparse, None is skipped); `apply` applies them once
with the wrapped optimizer, so `global_step` moves once per step.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional

import tensorflow as tf

from estimator_multigpu.graph import sharing
from estimator_multigpu.strategies import base

tf1 = tf.compat.v1


class SharedVariables(base.VariableStrategy):
  """One copy of each variable, on the aggregation device; one update."""

  name = "shared"
  variable_update = "shared"

  def __init__(self, plan: Any):
    super().__init__(plan)
    self._sharing = sharing.VariableSharing()
    self._globals_after_tower0: set = set()

  def placement(self, tower: Any) -> Any:
    if tower.device is None:
      return None
    variable_device = self.plan.variable_device
    return (base.device_function(tower.device, variable_device)
            if variable_device else tower.device)

  @contextlib.contextmanager
  def sharing_scope(self, tower: Any):
    if tower.index == 0:
      with self._sharing.tower0_scope():
        yield
      self._sharing.finish_tower0()
      self._globals_after_tower0 = {v.op.name for v in tf1.global_variables()}
      return
    substitute = self.substitute(tower)
    with sharing.reuse_scope_for_get_variable(tower, substitute), \
        self._sharing.reuse_scope(tower, substitute):
      yield
    sharing.check_no_new_globals(tower, self._globals_after_tower0)

  def substitute(self, tower: Any) -> Optional[Callable]:
    """What tower 1.. gets instead of tower 0's variable (None: that one)."""
    del tower
    return None

  def combine(self, towers: list) -> list:
    updates = []
    device = self.plan.aggregation_device
    for position, calls in enumerate(base.calls_by_position(towers)):
      with tf.device(device), tf.name_scope("tower_gradients"):
        summed = sum_tower_gradients([call.grads_and_vars for call in calls])
      updates.append(base.Update(position, calls[0], towers[0], device,
                                 summed))
    return updates

  def apply(self, updates: list,
            apply_if: Optional[tf.Tensor] = None) -> list:
    ops = []
    for update in updates:
      call = update.call
      with tf.device(update.device), call.scopes():
        ops.append(call.optimizer.apply_combined(
            update.grads_and_vars, call.global_step, call.name,
            apply_if=apply_if))
    return ops


def sum_tower_gradients(tower_grads: list) -> list:
  """Sums per-variable gradients over towers.

  Args:
    tower_grads: per tower, a list of `(gradient, variable)` pairs over the
      same variables in the same order.

  Returns:
    One list of `(gradient, variable)`; a gradient is None when every tower's
    is None, `IndexedSlices` when every tower's is.
  """
  base.check_variables_line_up(tower_grads)
  variables = [v for _, v in tower_grads[0]]
  base.warn_no_gradient([[g for g, _ in pairs] for pairs in tower_grads],
                        variables)
  return [(_sum([g for g, _ in pairs if g is not None]), pairs[0][1])
          for pairs in zip(*tower_grads)]


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
