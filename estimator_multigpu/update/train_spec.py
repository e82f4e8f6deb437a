"""The update's part of the TRAIN spec: the chain run on the built towers.

`update_spec` checks that the towers' optimizers can be combined, runs the
update chain (`chain`, with the steps `steps.steps_for` builds from the
options), ties each optimizer call's update to what runs it (`triggers`),
merges the towers' specs around that train_op and lets every step finish
the spec (hooks, train_op dependencies, the accumulated loss).
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from estimator_multigpu.graph import specs as specs_lib
from estimator_multigpu.update import chain as chain_lib
from estimator_multigpu.update import keras_optimizer
from estimator_multigpu.update import loss_scaling as loss_scaling_lib
from estimator_multigpu.update import steps as steps_lib
from estimator_multigpu.update import triggers


def update_spec(towers: list, strategy: Any, options: Any,
                micro_batch_weight: Any,
                scaling: Optional[loss_scaling_lib.LossScaling],
                model_dir: Optional[str]) -> tf.estimator.EstimatorSpec:
  """The TRAIN spec of the towers' combined update.

  Args:
    towers: the built towers (their recorded optimizer calls).
    strategy: the plan's `strategies.VariableStrategy`.
    options: the decorator's `options.Options`.
    micro_batch_weight: what one micro-batch weighs when accumulating.
    scaling: float16's loss scale, or None.
    model_dir: where the loss-scale hook writes skipped updates.

  Raises:
    ValueError: the train_op does not come from a `TowerOptimizer`, or a
      Keras optimizer would be applied several times per step.
  """
  _check_wrapped(towers)
  keras_optimizer.check_strategy(towers, strategy)
  device = strategy.plan.aggregation_device
  chain = chain_lib.UpdateChain(strategy, steps_lib.steps_for(
      options, device=device, micro_batch_weight=micro_batch_weight,
      loss_scaling=scaling), device=device)
  apply_ops = triggers.tie(towers[0], chain.build(towers),
                           accumulate=options.accumulate_steps > 1,
                           peers=towers[1:])
  specs_lib.summarize_tower_losses(towers)
  spec = specs_lib.merge_specs(towers, tf.estimator.ModeKeys.TRAIN,
                               specs_lib.merged_train_op(towers, apply_ops))
  return chain.finish_spec(spec, towers, model_dir)


def _check_wrapped(towers: list) -> None:
  if not towers[0].optimizer_calls:
    raise ValueError(
        "The model_fn's train_op does not come from a `TowerOptimizer`; "
        f"with {len(towers)} towers an unwrapped optimizer would apply "
        f"{len(towers)} separate updates per step (and clipping needs it). "
        "Wrap it: opt = estimator_multigpu.TowerOptimizer(opt) (a "
        "tf.compat.v1.train or tf.keras.optimizers.legacy optimizer). With "
        "tf_slim.optimize_loss, pass optimizer=lambda lr: "
        "TowerOptimizer(tf.compat.v1.train.GradientDescentOptimizer(lr)) "
        "(or another optimizer) instead of a name such as 'SGD'.")
