"""The update chain: the towers' recorded gradients become one update.

Every training graph with towers runs the same chain, once per optimizer
call (`TowerOptimizer` call order) and per applier:

    combine     the strategy: one gradient per variable, on the applier's
                device (the aggregation device for "shared", every tower's
                for "replicated")
    steps       the list `update.steps.steps_for` builds from the options,
                in its order, e.g. float16's skip-on-non-finite and unscale
                (`loss_scaling`), accumulate (`accumulation`), clip
                (`clipping`)
    apply       the strategy: the wrapped optimizer applies them, when every
                step's `apply_if` holds (and its tf.cond branch is taken)

A step is an `UpdateStep` (optax's gradient transformations, tensorpack's
`GradientProcessor`): it may prepare once per graph, transform each update's
grads_and_vars, add a condition to applying, and add to the TRAIN spec
(`finish`: loss, train_op dependencies, hooks, summaries). The chain only
runs the list: the strategies know nothing of the steps, the steps nothing
of how gradients were combined, and a new step is its own module plus one
line in `steps_for`.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import tensorflow as tf

from estimator_multigpu.update import triggers


class UpdateStep:
  """A step of the update chain; every method defaults to doing nothing."""

  name = ""  # how `steps_for`'s list and its tests name the step.

  def prepare(self, towers: list) -> None:
    """Builds, once per graph and before any update is transformed, what
    the step needs from every tower's recorded optimizer calls."""
    del towers

  def transform(self, update: Any) -> list:
    """The update's new grads_and_vars; built on `update.device`.

    Args:
      update: a `strategies.base.Update` (position, call, device) with the
        grads_and_vars the steps before this one left.
    """
    return update.grads_and_vars

  def apply_if(self, call: Any) -> Optional[tf.Tensor]:
    """A scalar bool the optimizer `call`'s update is applied under (every
    step's must hold), or None."""
    del call
    return None

  def finish(self, spec: tf.estimator.EstimatorSpec, towers: list,
             output_dir: Optional[str]) -> tf.estimator.EstimatorSpec:
    """The TRAIN spec with what the step adds (steps finish in order)."""
    del towers, output_dir
    return spec

  def __repr__(self) -> str:
    return f"<update step {self.name}>"


class UpdateChain:
  """combine -> the steps, in order -> apply, for one graph."""

  def __init__(self, strategy: Any, steps: Sequence[UpdateStep], *,
               device: Optional[str]):
    """The chain of a plan's strategy through `steps`.

    Args:
      strategy: the plan's `strategies.VariableStrategy` (combine, apply).
      steps: the steps between them, in order (`steps.steps_for`).
      device: the aggregation device, where a tf.cond branch's condition
        is read.
    """
    self.strategy = strategy
    self.steps = list(steps)
    self.device = device

  def build(self, towers: list) -> list:
    """The apply ops of one step, through every step of the chain: per
    optimizer call (call order), the ops applying its combined update."""
    updates = self.strategy.combine(towers)
    for step in self.steps:
      step.prepare(towers)
    updates = [self._transform(update) for update in updates]
    return [self._apply([u for u in updates if u.position == position],
                        call, [tower.optimizer_calls[position]
                               for tower in towers])
            for position, call in enumerate(towers[0].optimizer_calls)]

  def _apply(self, updates: list, call, calls: list) -> list:
    """The strategy's apply of one optimizer call's updates, every op it
    creates after every tower's gradients of the call (`calls`)."""
    when = self._when(call)
    with tf.control_dependencies([self._gradients_ready(calls)]):
      return self.strategy.apply(updates, when)

  def _gradients_ready(self, calls: list) -> tf.Operation:
    """One barrier: an op that runs once every tower's gradients of one
    optimizer call (the towers' recorded `calls`) are computed.

    An optimizer's apply may create ops with no data edge from the
    gradient: decoupled weight decay's `var.assign_sub(wd * var)` under
    the apply's control (tf.contrib's `MomentumWOptimizer`,
    tensorflow-addons' `SGDW`), Lookahead's pull-back, moving averages. On
    one device they happen to run after the forward pass; with towers they
    could run before a tower reads the variable. Built under this barrier,
    each op of the apply that has no input from the apply gets one control
    edge (to the barrier), not one per gradient: `TowerOptimizer.
    compute_gradients` records what an edge per op per dependency costs.
    The towers' own gradients (not the combined ones) are waited for, so
    each variable's apply may still start as soon as its combined gradient
    is there (while the others' are summed or all-reduced).
    """
    parts = [part for recorded in calls
             for grad, _ in recorded.grads_and_vars if grad is not None
             for part in _parts(grad)]
    with tf.device(self.device), tf.control_dependencies(None):
      return tf.group(*parts, name="gradients_ready")

  def _transform(self, update):
    """Every step's transform, in order, on the update's device."""
    with tf.device(update.device):
      for step in self.steps:
        update = update.with_gradients(step.transform(update))
    return update

  def _when(self, call) -> Optional[tf.Tensor]:
    """What the call's update applies under: every step's condition, and
    for a call made in a tf.cond branch, that the branch is taken."""
    conditions = [c for c in (step.apply_if(call) for step in self.steps)
                  if c is not None]
    if call.branch is None:
      return _all(conditions)
    with tf.device(self.device), tf.name_scope("combined_update_if"):
      return _all([triggers.branch_taken(call.branch)] + conditions)

  def finish_spec(self, spec: tf.estimator.EstimatorSpec, towers: list,
                  output_dir: Optional[str]) -> tf.estimator.EstimatorSpec:
    """The spec with what every step adds, in order (accumulation's loss,
    the loss-scale update and hooks, ...)."""
    for step in self.steps:
      spec = step.finish(spec, towers, output_dir)
    return spec


def _parts(grad) -> list:
  """The tensors of a gradient (an `IndexedSlices`' values and indices)."""
  if isinstance(grad, tf.IndexedSlices):
    return [grad.values, grad.indices]
  return [grad]


def _all(conditions: list) -> Optional[tf.Tensor]:
  """The conditions' conjunction (None for none)."""
  return functools.reduce(tf.logical_and, conditions) if conditions else None
