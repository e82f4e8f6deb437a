"""What runs an optimizer's combined update: that optimizer's own tower-0 op.

On one device, `opt.minimize(loss)` returns the op that applies `opt`; the
session applies it when it runs that op, from the train_op, from a hook's
`run` (TF-GAN's sequential and joint train hooks run the discriminator's op
that way) or inside the taken branch of a `tf.cond`. With towers each
optimizer call returns a no-op (`TowerOptimizer.apply_gradients`), and the
combined update is tied to it here, one optimizer call at a time:

- a call made in the tower's graph: tower 0's no-op waits for that call's
  combined update (and nothing else), so whichever op reaches it applies
  only that optimizer's variables, once;
- a call made inside a `tf.cond` branch: a branch is a function graph and
  cannot reach the other towers' gradients, so `TowerOptimizer` computes the
  gradients outside the `tf.cond` (both branches' every step) and the
  combined update runs beside the train_op under a `tf.cond` of its own, on
  tower 0's predicate: for the branch taken, as on one device.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu.graph import dataflow

tf1 = tf.compat.v1

# The class of a `tf.cond` branch's function graph (cond_v2), by name: the
# class itself is private to TensorFlow.
_COND_BRANCH_GRAPH = "CondBranchFuncGraph"


def current_branch() -> Optional[tf.Graph]:
  """The `tf.cond` branch being built (a function graph), or None.

  Raises:
    ValueError: the graph being built is another function (a
      `tf.function`, a `tf.while_loop` body) or a branch of a nested
      `tf.cond`: no combined update can be tied to it.
  """
  graph = tf1.get_default_graph()
  if not graph.building_function:
    return None
  if (type(graph).__name__ != _COND_BRANCH_GRAPH or
      graph.outer_graph.building_function):
    raise ValueError(
        "`TowerOptimizer` was called inside a tf.function, a tf.while_loop "
        "or a nested tf.cond; `multi_gpu` combines the towers' gradients in "
        "the model_fn's graph, or in one (not nested) tf.cond branch. Call "
        "the optimizer in the model_fn itself or in one tf.cond's branch.")
  return graph


def outer_tensor(branch: tf.Graph, tensor: tf.Tensor) -> tf.Tensor:
  """The tensor of the graph around `branch` that `tensor` captures.

  Raises:
    ValueError: `tensor` was computed inside the branch.
  """
  if tensor.graph is branch.outer_graph:
    return tensor
  for external, internal in branch.captures:
    if internal is tensor:
      return external
  raise ValueError(
      f"The loss `{tensor.name}` given to `TowerOptimizer` inside a tf.cond "
      "branch was computed inside that branch. A branch cannot reach the "
      "other towers' gradients, so `multi_gpu` differentiates the loss "
      "outside the tf.cond: compute the losses before the tf.cond and only "
      "call opt.minimize(loss) in its branches, e.g. tf.cond(step % 2 == 0, "
      "lambda: d_opt.minimize(d_loss), lambda: g_opt.minimize(g_loss)).")


@contextlib.contextmanager
def outside(branch: Optional[tf.Graph]):
  """Builds in the graph around `branch` (no control dependencies)."""
  if branch is None:
    yield
    return
  with branch.outer_graph.as_default(), tf.control_dependencies(None):
    yield


def check_computed_outside(grads_and_vars: list, outside_ids: set) -> None:
  """Gradients applied in a branch must be `TowerOptimizer`'s, unchanged.

  Raises:
    ValueError: a gradient was computed (or transformed) inside a branch,
      e.g. `MixedPrecisionLossScaleOptimizer(TowerOptimizer(opt))`.
  """
  inside = [v.op.name for g, v in grads_and_vars
            if g is not None and id(g) not in outside_ids]
  if inside:
    raise ValueError(
        "`TowerOptimizer.apply_gradients` was called inside a tf.cond with "
        f"gradients (of {', '.join(inside[:3])}) that did not come from "
        "`TowerOptimizer.compute_gradients` (or `minimize`) in that branch. "
        "If an optimizer wraps the TowerOptimizer and applies conditionally "
        "(MixedPrecisionLossScaleOptimizer(TowerOptimizer(opt)) does), wrap "
        "the other way round, TowerOptimizer("
        "MixedPrecisionLossScaleOptimizer(opt, loss_scale)), or use "
        "multi_gpu(mixed_precision='float16'). To alternate optimizers, call "
        "opt.minimize(loss) in the branch, unclipped (clip with "
        "multi_gpu(clip_gradients_by_norm=...)).")


def branch_taken(branch: tf.Graph) -> tf.Tensor:
  """A scalar bool: whether the `tf.cond` runs `branch` this step."""
  for op in branch.outer_graph.get_operations():
    if op.type not in dataflow.CONDS:
      continue
    if op.get_attr("then_branch").name == branch.name:
      return tf.identity(op.inputs[0], name="branch_taken")
    if op.get_attr("else_branch").name == branch.name:
      return tf.logical_not(op.inputs[0], name="branch_taken")
  raise ValueError(
      f"multi_gpu found no tf.cond running the branch `{branch.name}` that "
      "called `TowerOptimizer`; the branch's result must be used.")


def tie(tower0, applies: list, accumulate: bool, peers: list = ()) -> list:
  """Ties each optimizer call's combined update to what runs it.

  Args:
    tower0: tower 0 (its `optimizer_calls`, in call order).
    applies: per optimizer call, the ops applying its combined update.
    accumulate: accumulate_steps > 1: the train_op runs every update (tower
      0's train_op runs for every micro-batch; it cannot wait for one).
    peers: towers 1..: their no-ops wait for the update too, so a write
      they order after `minimize` (a constraint on their replicated copies,
      run with tower 0's by `state_updates`) comes after it.

  Returns:
    The update ops the train_op must run itself: every one when
    accumulating, else those of calls made inside a `tf.cond` branch.
  """
  if accumulate:
    return [op for ops in applies for op in ops]
  extra = []
  for position, (call, ops) in enumerate(zip(tower0.optimizer_calls,
                                             applies)):
    ops = [op if isinstance(op, tf.Operation) else op.op for op in ops]
    if call.branch is not None:
      extra += ops
      continue
    for tower in [tower0] + list(peers):
      compat.private(tower.optimizer_calls[position].recorded,
                     "_add_control_inputs")(ops)
  return extra
