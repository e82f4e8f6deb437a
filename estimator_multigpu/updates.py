"""From the towers' combined gradients to one update: accumulation, loss scale.

A variable strategy (`strategies`) ends by handing each optimizer call's
combined gradients to `TowerOptimizer.apply_combined`. `UpdateRule` wraps that
seam, without changing any strategy, when `accumulate_steps` > 1 or
`mixed_precision="float16"`; for every call it builds:

    combined -> ÷ loss scale (float16) -> + earlier micro-batches, ÷ examples
      (accumulation) -> clip by global norm -> apply, unless a gradient of the
      step was not finite (float16)

and, beside it, the accumulate op (`accumulation.AccumulationHook` runs it for
micro-batches 1..k-1) and the loss-scale update.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Optional

import tensorflow as tf

from estimator_multigpu import accumulation
from estimator_multigpu import gradients as gradients_lib
from estimator_multigpu import mixed_precision

tf1 = tf.compat.v1


class _InterceptedOptimizer:
  """A `TowerOptimizer` whose `apply_combined` goes through the rule."""

  def __init__(self, optimizer: Any, rule: "UpdateRule"):
    self._optimizer = optimizer
    self._rule = rule

  def __getattr__(self, name):
    inner = self.__dict__.get("_optimizer")
    if inner is None:
      raise AttributeError(name)
    return getattr(inner, name)

  def apply_combined(self, grads_and_vars, global_step=None, name=None):
    return self._rule.apply(self._optimizer, list(grads_and_vars),
                            global_step, name)


class _ConditionalOptimizer(tf1.train.Optimizer):
  """Applies with the wrapped optimizer only when `condition` holds.

  `MixedPrecisionLossScaleOptimizer`'s pattern: the apply (and the
  `global_step` increment) inside a `tf.cond`; slots are created outside it
  by the v1 Optimizer's `init_scope`.
  """

  def __init__(self, optimizer: tf1.train.Optimizer, condition: tf.Tensor):
    super().__init__(use_locking=False, name=optimizer.get_name())
    self._optimizer = optimizer
    self._condition = condition

  def __getattr__(self, name):
    inner = self.__dict__.get("_optimizer")
    if inner is None:
      raise AttributeError(name)
    return getattr(inner, name)

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    grads_and_vars = list(grads_and_vars)
    return tf.cond(
        self._condition,
        lambda: tf.group(self._optimizer.apply_gradients(
            grads_and_vars, global_step, name)),
        tf.no_op, name="apply_if_finite")


@contextlib.contextmanager
def _applied_if(tower_optimizer: Any, condition: tf.Tensor):
  """Makes `tower_optimizer.apply_combined` apply only if `condition`.

  Only the wrapped optimizer's apply goes inside the `tf.cond`, so what
  `TowerOptimizer.apply_combined` adds around it (the gradient-norm summary)
  stays in the outer graph.
  """
  inner = tower_optimizer.__dict__.get("_optimizer")
  if not isinstance(inner, tf1.train.Optimizer):
    raise TypeError(
        f"float16 loss scaling needs a `TowerOptimizer`; got "
        f"{type(tower_optimizer).__name__}. Wrap the optimizer: "
        "estimator_multigpu.TowerOptimizer(opt).")
  tower_optimizer._optimizer = _ConditionalOptimizer(inner, condition)  # pylint: disable=protected-access
  try:
    yield
  finally:
    tower_optimizer._optimizer = inner  # pylint: disable=protected-access


@dataclasses.dataclass
class UpdateRule:
  """How one step's combined gradients become an update (see module doc).

  Attributes:
    accumulator: with `accumulate_steps` > 1, the running sums; else None.
    loss_scaling: with float16 training, the loss scale; else None.
    clip_norm: clip the update's gradients to this global norm, or None.
    device: where the rule's state and decisions live (aggregation device).
  """
  accumulator: Optional[accumulation.Accumulator]
  loss_scaling: Optional[mixed_precision.LossScaling]
  clip_norm: Optional[float]
  device: Optional[str] = None  # the aggregation device.
  _applied: int = 0
  _loss_scale_update: Optional[tf.Operation] = None

  @property
  def active(self) -> bool:
    return self.accumulator is not None or self.loss_scaling is not None

  @contextlib.contextmanager
  def intercepting(self, towers: list, strategy_name: str):
    """Routes the strategy's `apply_combined` calls through `apply`.

    Raises:
      ValueError: the strategy applied no gradients through
        `apply_combined`, so the rule could not act.
    """
    if self.loss_scaling is not None:
      with tf.device(self.device):
        self._decide(towers)
    originals = [list(tower.optimizer_calls) for tower in towers]
    for tower in towers:
      tower.optimizer_calls[:] = [
          dataclasses.replace(call, optimizer=_InterceptedOptimizer(
              call.optimizer, self)) for call in tower.optimizer_calls]
    try:
      yield
    finally:
      for tower, calls in zip(towers, originals):
        tower.optimizer_calls[:] = calls
    if self._applied < len(towers[0].optimizer_calls):
      raise ValueError(
          f"`variable_update={strategy_name!r}` applied "
          f"{self._applied} of {len(towers[0].optimizer_calls)} optimizer "
          "calls through `TowerOptimizer.apply_combined`, so "
          "`accumulate_steps` and float16 loss scaling cannot act on them. "
          "Use variable_update='shared', or accumulate_steps=1 and no "
          "float16.")

  def _decide(self, towers: list) -> None:
    """One apply-or-skip decision for the whole update (float16)."""
    finite = mixed_precision.all_finite(towers)
    if self.accumulator is not None:
      with tf.name_scope(accumulation.SCOPE):
        bad = self.accumulator.running_sum(
            "nonfinite_micro_batches", 1.0 - tf.cast(finite, tf.float32))
      finite = tf.equal(bad, 0.0)
    self._loss_scale_update = self.loss_scaling.update(finite)

  def apply(self, optimizer: Any, grads_and_vars: list, global_step,
            name: Optional[str]) -> tf.Operation:
    """The update for one optimizer call, from its combined gradients."""
    self._applied += 1
    if self.loss_scaling is not None:
      grads_and_vars = self.loss_scaling.unscale(grads_and_vars)
    if self.accumulator is not None:
      grads_and_vars = self.accumulator.gradients(grads_and_vars)
    if self.clip_norm is not None:
      grads_and_vars = gradients_lib.clip_by_global_norm(grads_and_vars,
                                                         self.clip_norm)
    if self.loss_scaling is None:
      return optimizer.apply_combined(grads_and_vars, global_step, name)
    with _applied_if(optimizer, self.loss_scaling.should_apply):
      return optimizer.apply_combined(grads_and_vars, global_step, name)

  def finish_spec(self, spec: tf.estimator.EstimatorSpec, towers: list,
                  output_dir: Optional[str]) -> tf.estimator.EstimatorSpec:
    """The spec with the update's loss and train_op, and the accumulate and
    loss-scale hooks (the train_op resets the accumulators last)."""
    with tf.device(self.device):
      return self._finish_spec(spec, towers, output_dir)

  def _finish_spec(self, spec, towers, output_dir):
    hooks = list(spec.training_hooks)
    loss, train_op = spec.loss, spec.train_op
    if self._loss_scale_update is not None:
      train_op = tf.group(train_op, self._loss_scale_update)
    if self.loss_scaling is not None:
      self.loss_scaling.summarize()
      hooks.append(self.loss_scaling.hook(output_dir))
    if self.accumulator is not None:
      loss = self.accumulator.loss(spec.loss)
      accumulate = self.accumulator.accumulate_op(*towers[0].step_ops())
      hooks.append(accumulation.AccumulationHook(accumulate,
                                                 self.accumulator.steps))
      train_op = self.accumulator.reset_after(train_op, loss)
    return spec._replace(loss=loss, train_op=train_op, training_hooks=hooks)
