"""The pipeline of one graph: plan -> shards -> towers -> update chain -> spec.

`build_spec` is what the `multi_gpu` decorator runs each time Estimator
builds a graph (TRAIN, EVAL, PREDICT, export): it makes the plan, splits the
global batch, builds the towers through the plan's variable strategy, runs
the update chain (TRAIN: combine -> the options' steps -> apply,
`update.train_spec`), merges the towers' specs and adds the EMA.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import tensorflow as tf

from estimator_multigpu import options as options_lib
from estimator_multigpu import strategies
from estimator_multigpu.cross_tower import across_tasks
from estimator_multigpu.cross_tower import context
from estimator_multigpu.cross_tower import regularization
from estimator_multigpu.cross_tower import sync_batch_norm
from estimator_multigpu.cross_tower import v1_losses
from estimator_multigpu.graph import batch_size_param
from estimator_multigpu.graph import calling
from estimator_multigpu.graph import ema as ema_lib
from estimator_multigpu.graph import empty_shards
from estimator_multigpu.graph import global_calls
from estimator_multigpu.graph import model_savers
from estimator_multigpu.graph import nan_guard
from estimator_multigpu.graph import plan as plan_lib
from estimator_multigpu.graph import precision as precision_lib
from estimator_multigpu.graph import readout_apis
from estimator_multigpu.graph import readouts
from estimator_multigpu.graph import specs as specs_lib
from estimator_multigpu.graph import splitting
from estimator_multigpu.graph import state_updates
from estimator_multigpu.graph import tensor_kinds
from estimator_multigpu.graph import towers as towers_lib
from estimator_multigpu.graph.global_batch import scopes as global_batch
from estimator_multigpu.strategies import all_reduce as all_reduce_lib
from estimator_multigpu.update import accumulation
from estimator_multigpu.update import canned
from estimator_multigpu.update import loss_scaling
from estimator_multigpu.update import tower_optimizer
from estimator_multigpu.update import train_spec

tf1 = tf.compat.v1
ModeKeys = tf.estimator.ModeKeys
Options = options_lib.Options


@dataclasses.dataclass
class _Graph:
  """What the functions building one graph's towers share: the call, the
  plan and the shards; the rest is made from them on creation."""
  options: Options
  mode: str
  params: Any
  config: Any
  plan: plan_lib.Plan
  cluster: Any  # the all-reduce cluster this TRAIN graph is a task of.
  split: Any  # `splitting.Split`: the shards.
  examples: Any = dataclasses.field(init=False)  # of the global batch.
  strategy: Any = dataclasses.field(init=False)
  scaling: Optional[loss_scaling.LossScaling] = dataclasses.field(init=False)
  shares: list = dataclasses.field(init=False)  # per tower, nᵢ / n.
  analyses: list = dataclasses.field(init=False)
  ranges: readouts.OpRanges = dataclasses.field(init=False)
  recorder: global_calls.Recorder = dataclasses.field(init=False)
  rewrites: list = dataclasses.field(init=False)  # per tower, its rewrite.

  def __post_init__(self):
    self.examples = _global_examples(self.split, self.cluster, self.plan)
    self.strategy = strategies.make_strategy(self.plan, self.mode)
    self.scaling = loss_scaling.for_graph(
        self.options.mixed_precision, self.mode, self.plan.aggregation_device)
    self.ranges = readouts.OpRanges()
    self.shares = _shares(self.split, self.examples)
    self.analyses = _analyses(self.split)
    self.recorder = global_calls.Recorder(self.analyses[0],
                                          self.options.loss_reduction)
    self.rewrites = []


def build_spec(model_fn, options: Options, features, labels, mode, params,
               config):
  """Builds the towers for one graph and merges their specs."""
  if calling.is_export_graph(features, mode):
    spec = calling.call_model_fn(model_fn, features, labels, mode, params,
                                 config)
    return model_savers.complete(_with_ema(spec, mode, options, None, config))
  cluster = _all_reduce_cluster(mode, config)
  plan = _make_plan(options, config, cluster,
                    keras=canned.trains_with_keras(model_fn))
  if plan.num_towers == 1 and not options.needs_towers and cluster is None:
    with tf.device(plan.devices[0]):
      spec = calling.call_model_fn(model_fn, features, labels, mode, params,
                                   config)
    specs_lib.publish_losses(spec.loss, [])
    return model_savers.complete(
        _with_ema(spec, mode, options, plan.aggregation_device, config))
  split = splitting.split_batch(
      features, labels, plan.num_towers, unsplit=options.unsplit_features,
      require_examples=mode in (ModeKeys.TRAIN, ModeKeys.EVAL))
  plan_lib.log_plan(plan, split, mode)
  if _on_global_batch(options, plan, mode):
    split = global_batch.unknown_batch(split)
  graph = _Graph(options, mode, params, config, plan, cluster, split)
  towers = _build_towers(model_fn, graph)
  specs_lib.check_scalar(towers[0].spec.loss)
  global_batch.log_rewrites(graph.rewrites, mode)
  _combine_readouts(graph, towers)
  spec = (_train_spec(graph, towers) if mode == ModeKeys.TRAIN else
          _merged_spec(graph, towers))
  return _finish(graph, spec, towers, features, labels)


def _build_towers(model_fn, graph: _Graph) -> list:
  """The model_fn once per tower, on its shard, in the towers' scopes."""
  options, split = graph.options, graph.split
  precision = (precision_lib.Precision(
      options.mixed_precision, graph.scaling and graph.scaling.value)
               if options.mixed_precision else None)
  # Weighted by their share of the examples; asynchronous towers each apply
  # their own (mean-loss) gradient whole.
  weights = (options.loss_reduction if graph.strategy.waits_for_towers else
             "sum")
  loss_weights = [split.loss_weight(i, weights, graph.examples)
                  for i in range(graph.plan.num_towers)]
  return towers_lib.build_towers(
      lambda tower, shard: _call_tower(model_fn, precision, shard,
                                       graph.mode, graph.params,
                                       graph.config),
      graph.plan, split.shards, graph.strategy, loss_weights=loss_weights,
      tower_scopes=_tower_scopes(graph, precision))


def _tower_scopes(graph: _Graph, precision) -> list:
  """The scope factories every tower is built in."""
  return ([graph.ranges.scope_factory,
           empty_shards.scope_factory(graph.split), graph.recorder.scope,
           readout_apis.scope] +
          ([precision.tower_scope] if precision else []) +
          ([canned.optimizer_scope] if graph.mode == ModeKeys.TRAIN else []) +
          [batch_size_param.scope_factory(graph.params, graph.split)] +
          _regularization_scopes(graph.options, graph.strategy, graph.split,
                                 bool(_global_batch_scopes(graph))) +
          _cross_tower_scopes(graph.plan, graph.split, graph.mode,
                              graph.options) + _global_batch_scopes(graph))


def _global_batch_scopes(graph: _Graph) -> list:
  """With several towers, every op of a tower that couples its shard runs
  on the global batch (`graph.global_batch`)."""
  if not _on_global_batch(graph.options, graph.plan, graph.mode):
    return []
  return [global_batch.scope_factory(
      graph.split, graph.shares, graph.options.loss_reduction,
      graph.analyses, graph.rewrites)]


def _on_global_batch(options: Options, plan, mode: str) -> bool:
  """Whether the towers' ops that couple the batch run on the global batch:
  with several towers, but not in asynchronous training, where each
  tower's step is its own (it applies the gradient of its own shard's
  loss, `synchronization="async"`)."""
  own_steps = mode == ModeKeys.TRAIN and not strategies.lookup(
      plan.strategy).waits_for_towers
  return (options.global_batch and len(plan.collective_devices) > 1 and
          not own_steps)


def _combine_readouts(graph: _Graph, towers: list) -> None:
  """What the user reads (summaries, metrics, ...) over the global batch."""
  batch_size_param.check_loss(towers[0], graph.params, graph.split,
                              graph.options.loss_reduction)
  graph.recorder.bind(towers, graph.shares)
  graph.ranges.drop(graph.recorder.built_ops)
  readouts.combine(towers, graph.shares, graph.analyses[0], graph.ranges,
                   graph.recorder.built_ops, graph.split.shards)
  if graph.mode == ModeKeys.PREDICT and towers[0].spec.predictions is not None:
    readouts.warn_coupled_predictions(towers[0].spec.predictions,
                                      graph.analyses[0])


def _merged_spec(graph: _Graph, towers: list) -> tf.estimator.EstimatorSpec:
  """EVAL and PREDICT: the towers' specs merged over the global batch."""
  return specs_lib.merge_specs(towers, graph.mode, shares=graph.shares,
                               analyses=graph.analyses,
                               built=graph.recorder.built_ops,
                               pad_value=graph.options.prediction_pad_value)


def _finish(graph: _Graph, spec, towers: list, features, labels):
  """The losses published; the EMA, the cluster and the NaN guard added."""
  specs_lib.publish_losses(spec.loss, [tower.spec.loss for tower in towers])
  scaling, plan = graph.scaling, graph.plan
  spec = _with_ema(spec, graph.mode, graph.options, plan.aggregation_device,
                   graph.config, applied=scaling and scaling.should_apply)
  spec = _across_tasks(model_savers.complete(spec), graph.cluster, plan,
                       graph.strategy.carried)
  global_batch.finish(graph.rewrites)
  return nan_guard.guard(spec, features, labels) if spec.train_op else spec


def _shares(split, examples) -> list:
  """Each tower's share of the global batch, nᵢ / n (0 for an empty one)."""
  return [split.loss_weight(i, "mean", examples)
          for i in range(len(split.shards))]


def _analyses(split) -> list:
  """Per tower, what its tensors are relative to its shard (`tensor_kinds`)."""
  return [tensor_kinds.shard_analysis(shard) for shard in split.shards]


def _all_reduce_cluster(mode: str, config):
  """The all-reduce cluster this TRAIN graph is one task of, or None."""
  if mode != ModeKeys.TRAIN:
    return None
  return across_tasks.AllReduceCluster.from_run_config(config)


def _make_plan(options: Options, config, cluster,
               keras: bool = False) -> plan_lib.Plan:
  """The plan: the strategy the options name ("auto" resolved: shared
  variables for a `keras` canned model_fn); in an all-reduce cluster, on
  this task's devices, in a collective group of every task's towers."""
  plan = plan_lib.make_plan(
      options.groups, options.aggregation_device,
      getattr(config, "session_config", None))
  if cluster is not None:
    plan = dataclasses.replace(
        plan, groups=[[cluster.qualify(d) for d in g] for g in plan.groups],
        variable_device=cluster.qualify(plan.variable_device or
                                        plan.devices[0]),
        aggregation_device=cluster.qualify(plan.aggregation_device),
        group_devices=cluster.group_devices(plan.devices),
        first_tower=cluster.position * plan.num_towers)
  num_ps = getattr(config, "num_ps_replicas", 0) or 0
  strategy = strategies.choose(
      options.variable_update, options.synchronization,
      replicate=(cluster is not None or options.asks_for_all_reduce or
                 (plan.gpu_towers >= 2 and not num_ps and not keras)))
  plan = dataclasses.replace(
      plan, strategy=strategy.name,
      copies_per_tower=strategy.copies_per_tower,
      all_reduce=options.all_reduce or (
          "collective" if cluster is None else "hierarchical"),
      gradient_packing_bytes=options.packing_bytes)
  _check_strategy(plan, cluster, num_ps)
  return plan


def _global_examples(split, cluster, plan):
  """The global batch's examples: this graph's, or Σ over the tasks (every
  step only when some task's batch size is not static)."""
  if cluster is None:
    return split.global_batch_size
  with tf.device(plan.aggregation_device), tf.name_scope("global_batch"):
    total = across_tasks.sum_over_tasks(
        tf.cast(split.global_batch_size, tf.float32), cluster,
        plan.devices[0])
    # A static batch is the same every step: summed once per session.
    return across_tasks.once_per_session(total) if split.static else total


def _across_tasks(spec, cluster, plan, carried=None):
  """In an all-reduce cluster: the loss of every task's batch (`carried`
  with the gradients, else a sum of its own), and every task starting from
  the chief's variables."""
  if cluster is None:
    return spec
  loss = carried
  if loss is None:
    with tf.device(plan.aggregation_device), tf.name_scope("global_loss"):
      loss = across_tasks.sum_over_tasks(spec.loss, cluster,
                                           plan.devices[0])
  return spec._replace(loss=loss, scaffold=across_tasks.broadcast_scaffold(
      spec.scaffold, cluster, plan.devices[0]))


def _call_tower(model_fn, precision, shard, mode, params, config):
  """One tower's spec; with mixed precision, low-precision features in and
  a float32 loss out."""
  features, labels = shard
  if precision is None:
    return calling.call_model_fn(model_fn, features, labels, mode, params,
                                 config)
  spec = calling.call_model_fn(model_fn, precision.cast_features(features),
                               labels, mode, params, config)
  return precision.finish(spec)


def _train_spec(graph: _Graph, towers: list) -> tf.estimator.EstimatorSpec:
  """TRAIN: the model_fn's writes reconciled, the update chain's spec, and
  for towers that do not wait for each other the global batch's loss."""
  options, split = graph.options, graph.split
  towers[0].deferred_dependencies += state_updates.reconcile(
      towers, split.shards[0], graph.ranges.ops)
  weight = (accumulation.micro_batch_weight(towers[0], graph.examples,
                                            split.shards[0])
            if options.accumulate_steps > 1 else graph.examples)
  if graph.cluster is not None and options.accumulate_steps == 1 and not any(
      call.branch is not None for call in towers[0].optimizer_calls):
    with tf.name_scope("global_loss"):  # summed with the gradients.
      graph.strategy.carry(specs_lib.loss_terms(towers))
  spec = train_spec.update_spec(towers, graph.strategy, options, weight,
                                graph.scaling,
                                getattr(graph.config, "model_dir", None))
  if graph.strategy.waits_for_towers:
    return spec
  return spec._replace(loss=specs_lib.combine_losses(towers, [
      split.loss_weight(i, options.loss_reduction, graph.examples)
      for i in range(graph.plan.num_towers)]))


def _check_strategy(plan: plan_lib.Plan, cluster, num_ps: int) -> None:
  """A copy per tower needs all-reducing tasks, and they need it."""
  copies = strategies.lookup(plan.strategy).copies_per_tower
  if copies and num_ps > 0:
    raise ValueError(
        f"variable_update={plan.strategy!r} was given in a cluster with "
        f"{num_ps} parameter server task(s). Parameter servers hold the one "
        "copy of each variable that every worker updates; replicated "
        "variables live in each tower. Use variable_update='shared' (or "
        "'auto') in a ps cluster.")
  if cluster is not None and (not copies or plan.all_reduce not in
                              all_reduce_lib.ACROSS_TASKS):
    raise ValueError(
        f"The cluster ({', '.join(cluster.cluster)} tasks, no ps) trains by "
        "all-reducing between its tasks, which needs a copy of the variables "
        f"per tower and all_reduce in {list(all_reduce_lib.ACROSS_TASKS)}; got the "
        f"{plan.strategy!r} strategy, all_reduce={plan.all_reduce!r}. Pass "
        "variable_update='auto' or 'replicated' (train.py --variable_update),"
        " and drop all_reduce='add_n'; or add ps tasks for 'shared'.")


def _regularization_scopes(options: Options, strategy, split,
                           global_batch_on: bool) -> list:
  """Towers 1.. see regularization so it counts once; with "sum" over
  towers that wait for each other, tower 0's weight terms count alone
  (`cross_tower.regularization`), unless the global batch's rewrite counts
  every uniform term of a tower's loss by its share (`tower_loss`)."""
  if len(split.shards) < 2:
    return []
  return [regularization.scope_factory(
      split, options.loss_reduction == "sum" and strategy.waits_for_towers
      and not global_batch_on)]


def _cross_tower_scopes(plan, split, mode, options: Options) -> list:
  """With several towers: the cross-tower context (`emg.cross_tower_sum`
  &co.), `tf.compat.v1.losses` over the global batch (TRAIN, EVAL) and
  batch norm over the global batch (TRAIN with `sync_batch_norm`), or a
  warning that it is per tower (TRAIN without)."""
  if len(plan.collective_devices) == 1:
    return []
  group = plan.collective_group
  scopes = [context.scope_factory(group, split.sizes,
                                  options.loss_reduction == "mean")]
  if mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
    scopes.append(v1_losses.loss_scope)
  if mode == ModeKeys.TRAIN:
    scopes.append(sync_batch_norm.scope_factory(group)
                  if options.sync_batch_norm else
                  sync_batch_norm.per_tower_scope)
  return scopes


def _with_ema(spec, mode, options: Options, device: Optional[str], config,
              applied=None):
  """The EMA the options ask for (`ema.finish_spec`). With a
  SyncReplicasOptimizer only the chief updates the average, once per global
  step after the aggregated update; every worker updating it would average
  each step once per worker."""
  if mode == ModeKeys.TRAIN and tf1.get_collection(
      tower_optimizer.SYNC_REPLICAS_COLLECTION) and not getattr(
          config, "is_chief", True):
    return spec
  return ema_lib.finish_spec(spec, mode == ModeKeys.TRAIN, options.ema_decay,
                             options.use_ema_weights, device, applied)
