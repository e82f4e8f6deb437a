"""What the replicated strategy refuses: optimizers that would move twice.

With `variable_update="replicated"` every tower applies the same update with
its own copy of the optimizer; an apply that writes a variable the towers
share, or an optimizer that aggregates on parameter servers, would move a
variable once per tower. Both are refused, naming the fix.
"""

from __future__ import annotations

import tensorflow as tf

from estimator_multigpu.graph import writes

tf1 = tf.compat.v1


def refuse_shared_writes(optimizer, tower, ops: list, own: set) -> None:
  """Tower `tower`'s apply may write only its own copies and state.

  Raises:
    ValueError: it writes a variable every tower shares (state the
      optimizer made outside its apply, `global_step`): it would move once
      per tower per step.
  """
  shared_writes = sorted({w.variable.name for op in ops
                          for w in writes.writes_of(op)
                          if w.variable not in own})
  if shared_writes:
    raise ValueError(
        f"{type(optimizer).__name__}'s apply_gradients writes "
        f"`{shared_writes[0]}`, a variable it did not make in its apply (made "
        "in the model_fn or the optimizer's constructor, or global_step), so "
        "with variable_update='replicated', where every tower applies the "
        f"update with a copy of the optimizer, it would move {tower.index + 1}"
        " or more times per step. Make it in apply_gradients or _create_slots"
        " (or leave global_step to the global_step argument), or pass "
        "variable_update='shared'.")


def refuse_sync_replicas(optimizer) -> None:
  """Raises: ValueError: `optimizer` wraps a `SyncReplicasOptimizer`."""
  if isinstance(optimizer.wrapped, tf1.train.SyncReplicasOptimizer):
    raise ValueError(
        "`SyncReplicasOptimizer` was given with variable_update='replicated'. "
        "It aggregates gradients on parameter servers, which hold one copy "
        "of each variable; the replicated mode keeps a copy per tower. Use "
        "variable_update='shared' with SyncReplicasOptimizer.")
