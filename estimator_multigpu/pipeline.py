"""The pipeline of one graph: plan -> shards -> towers -> one update -> spec.

`build_spec` is what the `multi_gpu` decorator runs each time Estimator
builds a graph (TRAIN, EVAL, PREDICT, export): it makes the plan, splits the
global batch, builds the towers through the plan's variable strategy, turns
their recorded gradients into one update (with accumulation, loss scaling
and clipping as the options ask), merges their specs and adds the EMA.
"""

from __future__ import annotations

import sys
from typing import Optional

import tensorflow as tf
from tensorflow.python.util import function_utils  # pylint: disable=g-direct-tensorflow-import

from estimator_multigpu import accumulation
from estimator_multigpu import ema as ema_lib
from estimator_multigpu import gradients as gradients_lib
from estimator_multigpu import mixed_precision as mixed_precision_lib
from estimator_multigpu import options as options_lib
from estimator_multigpu import plan as plan_lib
from estimator_multigpu import specs as specs_lib
from estimator_multigpu import splitting
from estimator_multigpu import strategies
from estimator_multigpu import sync_batch_norm as sync_batch_norm_lib
from estimator_multigpu import towers as towers_lib
from estimator_multigpu import updates

tf1 = tf.compat.v1
ModeKeys = tf.estimator.ModeKeys
Options = options_lib.Options


def call_model_fn(model_fn, features, labels, mode, params, config):
  """Calls `model_fn` with the arguments it declares; checks what it returns."""
  accepted = _fn_args(model_fn)
  kwargs = {name: value for name, value in
            (("params", params), ("config", config), ("mode", mode))
            if name in accepted}
  spec = model_fn(features, labels, **kwargs) if "labels" in accepted else (
      model_fn(features, **kwargs))
  if hasattr(spec, "as_estimator_spec"):  # TPUEstimatorSpec (Google BERT).
    spec = spec.as_estimator_spec()
  if not isinstance(spec, tf.estimator.EstimatorSpec):
    raise TypeError(
        f"The model_fn returned {type(spec).__name__} ({spec!r:.80}); "
        "expected a tf.estimator.EstimatorSpec. Return one for every mode.")
  if mode in (ModeKeys.TRAIN, ModeKeys.EVAL) and spec.loss is None:
    raise ValueError(
        f"The model_fn returned an EstimatorSpec without a loss in {mode} "
        "mode; `multi_gpu` needs each tower's loss to combine them.")
  return spec


def _fn_args(fn) -> tuple:
  return tuple(function_utils.fn_args(fn))


def building_export_graph() -> bool:
  """Whether Estimator is building a SavedModel graph right now."""
  frame = sys._getframe(1)  # pylint: disable=protected-access
  while frame is not None:
    if frame.f_code.co_name == "_add_meta_graph_for_mode":
      return True
    frame = frame.f_back
  return False


def build_spec(model_fn, options: Options, features, labels, mode, params,
               config):
  """Builds the towers for one graph and merges their specs."""
  if building_export_graph():
    spec = call_model_fn(model_fn, features, labels, mode, params, config)
    return _with_ema(spec, mode, options, None, config)
  plan = plan_lib.make_plan(options.groups, options.aggregation_device,
                            getattr(config, "session_config", None),
                            options.variable_update,
                            all_reduce=options.all_reduce,
                            gradient_packing_bytes=options.gradient_packing_bytes)
  if plan.num_towers == 1 and not options.needs_towers:
    with tf.device(plan.devices[0]):
      spec = call_model_fn(model_fn, features, labels, mode, params, config)
    specs_lib.publish_losses(spec.loss, [])
    return _with_ema(spec, mode, options, plan.aggregation_device, config)
  split = splitting.split_batch(
      features, labels, plan.num_towers, unsplit=options.unsplit_features,
      require_examples=mode in (ModeKeys.TRAIN, ModeKeys.EVAL))
  plan_lib.log_plan(plan, split, mode)
  if mode == ModeKeys.TRAIN and options.variable_update == "replicated":
    _check_no_parameter_servers(config)
  strategy = strategies.make_strategy(plan, mode)
  precision = mixed_precision_lib.Precision.create(
      options.mixed_precision, mode, plan.aggregation_device)
  towers = towers_lib.build_towers(
      lambda tower, shard: _call_tower(model_fn, precision, shard, mode,
                                       params, config),
      plan, split.shards, strategy,
      loss_weights=[split.loss_weight(i, options.loss_reduction)
                    for i in range(plan.num_towers)],
      tower_scopes=([precision.tower_scope] if precision else []) +
      _sync_batch_norm_scopes(plan, mode, options))
  rule = (_update_rule(options, precision, split, plan.aggregation_device)
          if mode == ModeKeys.TRAIN else None)
  train_op = (_train_op(towers, strategy, options, rule)
              if mode == ModeKeys.TRAIN else None)
  spec = specs_lib.merge_specs(towers, mode, train_op)
  if rule is not None and rule.active:
    spec = rule.finish_spec(spec, towers, getattr(config, "model_dir", None))
  specs_lib.publish_losses(spec.loss, [tower.spec.loss for tower in towers])
  scaling = precision.loss_scaling if precision else None
  return _with_ema(spec, mode, options, plan.aggregation_device, config,
                   applied=scaling.should_apply if scaling else None)


def _call_tower(model_fn, precision, shard, mode, params, config):
  """One tower's spec; with mixed precision, low-precision features in and
  a float32 loss out."""
  features, labels = shard
  if precision is None:
    return call_model_fn(model_fn, features, labels, mode, params, config)
  spec = call_model_fn(model_fn, precision.cast_features(features), labels,
                       mode, params, config)
  return precision.finish(spec)


def _update_rule(options: Options, precision, split,
                 device: Optional[str]) -> updates.UpdateRule:
  """Accumulation and loss scaling between the strategy and the optimizer."""
  accumulator = None
  if options.accumulate_steps > 1:
    with tf.device(device):
      accumulator = accumulation.Accumulator.create(
          options.accumulate_steps, options.loss_reduction,
          split.global_batch_size)
  return updates.UpdateRule(
      accumulator, precision.loss_scaling if precision else None,
      options.clip_gradients_by_norm, device)


def _check_no_parameter_servers(config) -> None:
  num_ps = getattr(config, "num_ps_replicas", 0) or 0
  if num_ps > 0:
    raise ValueError(
        f"variable_update='replicated' was given in a cluster with {num_ps} "
        "parameter server task(s). Parameter servers hold the one copy of "
        "each variable that every worker updates; replicated variables live "
        "in each tower. Use variable_update='shared' in a ps cluster.")


def _sync_batch_norm_scopes(plan, mode, options: Options) -> list:
  """Synchronized batch norm's tower scope, in TRAIN with several towers."""
  if not options.sync_batch_norm or mode != ModeKeys.TRAIN or (
      plan.num_towers == 1):
    return []
  return [sync_batch_norm_lib.scope_factory(plan.devices)]


def _train_op(towers: list, strategy: strategies.VariableStrategy,
              options: Options, rule: updates.UpdateRule) -> tf.Operation:
  if not towers[0].optimizer_calls:
    raise ValueError(
        "The model_fn's train_op does not come from a `TowerOptimizer`; "
        f"with {len(towers)} towers an unwrapped optimizer would apply "
        f"{len(towers)} separate updates per step (and clipping needs it). "
        "Wrap it: opt = estimator_multigpu.TowerOptimizer(opt). With "
        "tf_slim.optimize_loss, pass optimizer=lambda lr: "
        "TowerOptimizer(tf.compat.v1.train.GradientDescentOptimizer(lr)) "
        "(or another optimizer) instead of a name such as 'SGD'.")
  if rule.active:  # accumulation / loss scaling wrap the apply (and clip).
    with rule.intercepting(towers, options.variable_update):
      apply_ops = strategy.apply_gradients(towers, None)
  else:
    apply_ops = strategy.apply_gradients(towers,
                                         options.clip_gradients_by_norm)
  specs_lib.summarize_tower_losses(towers)
  return specs_lib.merged_train_op(towers, apply_ops)


def _with_ema(spec, mode, options: Options, device: Optional[str], config,
              applied=None):
  """Adds the EMA update (TRAIN) or the averaged-weight saver (others).

  `applied` (float16 training): whether the step's update was applied; a
  skipped update leaves the average unchanged too.

  With a SyncReplicasOptimizer only the chief updates the average, once per
  global step after the aggregated update; every worker updating it would
  average each step once per worker.
  """
  if options.ema_decay is None:
    return spec
  if mode == ModeKeys.TRAIN and tf1.get_collection(
      gradients_lib.SYNC_REPLICAS_COLLECTION) and not getattr(
          config, "is_chief", True):
    return spec
  if mode == ModeKeys.TRAIN:
    return spec._replace(train_op=ema_lib.apply_after(
        spec.train_op, options.ema_decay, device, applied))
  if not options.use_ema_weights:
    return spec
  return spec._replace(scaffold=ema_lib.restoring_scaffold(
      spec.scaffold, options.ema_decay))
