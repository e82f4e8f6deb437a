""""async" towers: one shared copy; every tower applies its own gradient.

tensorpack's `AsyncMultiGPUTrainer`, the classic multi-GPU recipe's
asynchronous variant (`multi_gpu(synchronization="async")`). Variables are
shared as in "shared"; `combine` keeps each tower's gradients apart (each
the gradient of the tower's own mean loss: the towers' loss weights are 1,
and 0 for an empty shard), and `apply` has the wrapped optimizer apply each
tower's gradients as soon as they exist. Within a step the applies are
chained in tower order, so no update is lost to a race and the slots move
deterministically; tower 0's optimizer applies them all, so there is one set
of slots with the single-device names (state made with `get_variable`, as
BERT's optimizer makes it, is reused from the second apply on).
`global_step` moves once, with the last tower's update.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import tensorflow as tf

from estimator_multigpu.strategies import base
from estimator_multigpu.strategies import shared


def _reusing(reuse: bool):
  """After the first apply, `get_variable` returns the state it made
  (BERT's and LAMB's moments: `get_variable(param_name + "/adam_m")`)."""
  if not reuse:
    return contextlib.nullcontext()
  return tf.compat.v1.variable_scope(
      tf.compat.v1.get_variable_scope(), reuse=tf.compat.v1.AUTO_REUSE,
      auxiliary_name_scope=False)


class AsyncTowers(shared.SharedVariables):
  """Shared variables; each tower's gradient applied on its own."""

  name = "async"
  synchronization = "async"
  waits_for_towers = False

  def combine(self, towers: list) -> list:
    device = self.plan.aggregation_device
    updates = []
    for position, calls in enumerate(base.calls_by_position(towers)):
      base.check_variables_line_up([call.grads_and_vars for call in calls])
      updates += [base.Update(position, calls[0], tower, device,
                              call.grads_and_vars)
                  for tower, call in zip(towers, calls)]
    return updates

  def apply(self, updates: list,
            apply_if: Optional[tf.Tensor] = None) -> list:
    del apply_if  # float16's all-tower decision is refused with "async".
    ops, previous = [], []
    last = {u.position: u.tower.index for u in updates}
    for update in updates:
      call = update.call
      step = (call.global_step if update.tower.index == last[update.position]
              else None)
      with tf.device(update.device), call.scopes(), \
          _reusing(update.tower.index > 0), tf.control_dependencies(previous):
        op = call.optimizer.apply_combined(
            update.grads_and_vars, step, f"{call.name or 'apply'}_"
            f"{update.tower.name}")
      previous = [op]
      ops.append(op)
    return ops
