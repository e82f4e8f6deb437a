"""The update chain: the towers' recorded gradients become one update.

Every training graph with towers runs the same explicit chain, once per
optimizer call (`TowerOptimizer` call order) and per applier:

    combine     the strategy: one gradient per variable, on the applier's
                device (the aggregation device for "shared", every tower's
                for "replicated")
    unscale     float16: ÷ the loss scale (`loss_scaling`)
    accumulate  accumulate_steps=k: + the earlier micro-batches, ÷ their
                examples (`accumulation`)
    clip        clip_gradients_by_norm: to a global norm (`clipping`)
    apply       the strategy: the wrapped optimizer applies them, unless a
                gradient of the step was not finite (float16)

Beside it the chain builds the accumulate op (`AccumulationHook` runs it for
micro-batches 1..k-1), the loss-scale update and their hooks
(`finish_spec`). The strategies know nothing of the middle steps; the steps
know nothing of how gradients were combined.
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from estimator_multigpu.update import accumulation
from estimator_multigpu.update import clipping
from estimator_multigpu.update import loss_scaling as loss_scaling_lib
from estimator_multigpu.update import triggers


class UpdateChain:
  """combine -> unscale -> accumulate -> clip -> apply, for one graph."""

  def __init__(self, strategy: Any, *, device: Optional[str],
               accumulate_steps: int = 1, loss_reduction: str = "mean",
               global_batch_size: Any = None,
               loss_scaling: Optional[loss_scaling_lib.LossScaling] = None,
               clip_norm: Optional[float] = None):
    """The chain of a plan's strategy, with the steps the options ask for.

    Args:
      strategy: the plan's `strategies.VariableStrategy` (combine, apply).
      device: the aggregation device: the loss scale, the apply-or-skip
        decision and the accumulated loss live there.
      accumulate_steps: k micro-batches per update (1: no accumulate step).
      loss_reduction: "mean" or "sum", how micro-batches are weighted.
      global_batch_size: a micro-batch's examples (int or scalar tensor).
      loss_scaling: float16's loss scale, or None.
      clip_norm: the clip step's global norm, or None.
    """
    self.strategy = strategy
    self.device = device
    self.loss_scaling = loss_scaling
    self.clip_norm = clip_norm
    self._accumulation = ((accumulate_steps, loss_reduction,
                           global_batch_size)
                          if accumulate_steps > 1 else None)
    self._accumulators: dict = {}  # device -> accumulation.Accumulator.
    self._loss_scale_update: Optional[tf.Operation] = None

  def build(self, towers: list) -> list:
    """The apply ops of one step, through every step of the chain: per
    optimizer call (call order), the ops applying its combined update."""
    updates = self.strategy.combine(towers)
    apply_if = self._decide(towers)
    updates = [self._middle(update) for update in updates]
    return [self.strategy.apply(
        [u for u in updates if u.position == position],
        self._when(call, apply_if))
            for position, call in enumerate(towers[0].optimizer_calls)]

  def _when(self, call, apply_if: Optional[tf.Tensor]
            ) -> Optional[tf.Tensor]:
    """A call made in a tf.cond branch applies when the branch is taken."""
    if call.branch is None:
      return apply_if
    if self._accumulation is not None:
      raise ValueError(
          "`TowerOptimizer` was called inside a tf.cond branch with "
          f"accumulate_steps={self._accumulation[0]}: the micro-batches of "
          "one update could take different branches. Use accumulate_steps=1"
          ", or call every optimizer outside the tf.cond.")
    with tf.device(self.device), tf.name_scope("combined_update_if"):
      taken = triggers.branch_taken(call.branch)
      return taken if apply_if is None else tf.logical_and(taken, apply_if)

  def _middle(self, update):
    """unscale -> accumulate -> clip, on the update's device."""
    grads_and_vars = update.grads_and_vars
    with tf.device(update.device):
      if self.loss_scaling is not None:
        grads_and_vars = self.loss_scaling.unscale(grads_and_vars)
      if self._accumulation is not None:
        grads_and_vars = self._accumulator(update.device).gradients(
            grads_and_vars)
      if self.clip_norm is not None:
        with tf.name_scope("clip_gradients"):
          grads_and_vars = clipping.clip_by_global_norm(grads_and_vars,
                                                        self.clip_norm)
    return update.with_gradients(grads_and_vars)

  def _accumulator(self, device: Optional[str]) -> accumulation.Accumulator:
    """The running sums kept on `device` (made once per device)."""
    if device not in self._accumulators:
      with tf.device(device):
        self._accumulators[device] = accumulation.Accumulator.create(
            *self._accumulation)
    return self._accumulators[device]

  def _decide(self, towers: list) -> Optional[tf.Tensor]:
    """float16: one apply-or-skip decision for the whole update."""
    if self.loss_scaling is None:
      return None
    with tf.device(self.device):
      finite = loss_scaling_lib.all_finite(towers)
      if self._accumulation is not None:
        with tf.name_scope(accumulation.SCOPE):
          bad = self._accumulator(self.device).running_sum(
              "nonfinite_micro_batches", 1.0 - tf.cast(finite, tf.float32))
        finite = tf.equal(bad, 0.0)
      self._loss_scale_update = self.loss_scaling.update(finite)
    return self.loss_scaling.should_apply

  def finish_spec(self, spec: tf.estimator.EstimatorSpec, towers: list,
                  output_dir: Optional[str]) -> tf.estimator.EstimatorSpec:
    """The spec with the update's loss and train_op, and the accumulate and
    loss-scale hooks (the train_op resets the accumulators last)."""
    with tf.device(self.device):
      hooks = list(spec.training_hooks)
      loss, train_op = spec.loss, spec.train_op
      if self.loss_scaling is not None:
        train_op = tf.group(train_op, self._loss_scale_update)
        self.loss_scaling.summarize()
        hooks.append(self.loss_scaling.hook(output_dir))
      if self._accumulation is not None:
        loss, train_op, hook = self._accumulate(spec.loss, train_op, towers)
        hooks.append(hook)
      return spec._replace(loss=loss, train_op=train_op, training_hooks=hooks)

  def _accumulate(self, loss, train_op, towers: list) -> tuple:
    """The update's loss, the train_op that resets the sums, the hook."""
    main = self._accumulator(self.device)
    loss = main.loss(loss)
    others = [a for d, a in self._accumulators.items() if d != self.device]
    accumulate = tf.group(
        main.accumulate_op(*towers[0].step_ops()),
        *[a.accumulate_op() for a in others])
    for accumulator in others:
      train_op = accumulator.reset_after(train_op)
    train_op = main.reset_after(train_op, loss)
    return loss, train_op, accumulation.AccumulationHook(
        accumulate, main.steps)
