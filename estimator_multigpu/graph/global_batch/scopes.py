"""The towers' scope of the global batch's rewrite, and what it rewrote."""


from __future__ import annotations

import collections
import contextlib
import dataclasses
from typing import Optional
import weakref

from absl import logging
import tensorflow as tf

from estimator_multigpu.graph.global_batch import kinds
from estimator_multigpu.graph.global_batch import state
from estimator_multigpu.graph.global_batch.rewrite import Shared
from estimator_multigpu.graph.global_batch.rewrite import TowerRewrite

tf1 = tf.compat.v1
# graph -> tower 0's `TowerRewrite` of each model built in it (not a graph
# collection: a saver would try to serialize it).
_BY_GRAPH: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()



def shard_kinds(shard) -> list:
  """(tensor, kind) of a shard's inputs: dense tensors per example along
  axis 0, SparseTensor components rows counted by their values."""
  pairs = []
  for leaf in tf.nest.flatten(shard):
    if isinstance(leaf, tf.SparseTensor):
      pairs += [(leaf.indices, kinds.LOCAL), (leaf.values, kinds.LOCAL),
                (leaf.dense_shape, kinds.shape_of(0))]
    elif isinstance(leaf, tf.Tensor) and leaf.shape.rank != 0:
      pairs.append((leaf, kinds.rows(0)))
  return pairs


def scope_factory(split, shares: list, loss_reduction: str,
                  analyses: Optional[list] = None, towers_out: list = None):
  """The `towers.build_towers` scope: each tower built through its
  `TowerRewrite` (`towers_out` collects them, in tower order)."""
  shared = Shared()
  share_kind = kinds.MEAN if loss_reduction == "mean" else kinds.SUM
  # Every tower builds the same ops (what pairs a hook's fetch by position).
  any_empty = any(split.may_be_empty(i) for i in range(len(split.shards)))

  @contextlib.contextmanager
  def scope(tower):
    analysis = analyses[tower.index] if analyses else None
    rewrite = TowerRewrite(
        tower.index, shard_kinds(split.shards[tower.index]),
        shares[tower.index], share_kind, shared,
        mark=(analysis.mark if analysis is not None else None),
        may_be_empty=any_empty)
    with state.tower_scope(rewrite):
      yield
      output = getattr(tower, "output", None)
      if getattr(output, "loss", None) is not None:
        tower.output = output._replace(loss=rewrite.tower_loss(output.loss))
    if towers_out is not None:
      towers_out.append(rewrite)
  return scope


def log_rewrites(rewrites_of_towers: list, mode: str) -> None:
  """One INFO line: what tower 0 runs on the global batch; the list kept in
  the graph (`rewrites`)."""
  if not rewrites_of_towers:
    return
  records = rewrites_of_towers[0].records
  _BY_GRAPH.setdefault(tf1.get_default_graph(), []).append(
      rewrites_of_towers[0])
  if not records:
    return
  by_type = collections.Counter(r.op_type for r in records)
  gathered = sum(r.gathered for r in records)
  statistics = sum(r.statistics for r in records)
  logging.info(
      "multi_gpu (%s): %d op(s) of the model_fn run on the global batch (%s); "
      "per tower %d per-example tensor(s) gathered, %d statistic(s) "
      "all-reduced. emg.global_batch_ops(graph) lists them.", mode, len(records),
      ", ".join(f"{n} {t}" for t, n in by_type.most_common()), gathered,
      statistics)


def finish(rewrites_of_towers: list) -> None:
  """Once the spec is built: every tower's `tf.cond` that exchanges with
  the others runs wherever tower 0's does (`Shared.run_branches_together`)."""
  if rewrites_of_towers:
    rewrites_of_towers[0].shared.run_branches_together(
        tf1.get_default_graph())


def global_batch_ops(graph: Optional[tf.Graph] = None) -> list:
  """What `multi_gpu` runs on the global batch in `graph`.

  Each model_fn op that couples the examples of a batch (contract item 24)
  is computed on the global batch; this lists them, as tower 0 built them.

  Args:
    graph: a graph a `multi_gpu` model_fn was built in (default: the
      default graph).

  Returns:
    One `Rewrite` per op, in build order: its `op_type`, the `name` of the
    op the model_fn built, `how` ("global": on the gathered batch; "local":
    its statistics and sizes made global; "combined": a reduction over the
    batch axis combined over the towers), and how many per-example tensors
    were `gathered` and `statistics` all-reduced for it.
  """
  graph = graph or tf1.get_default_graph()
  return [r for tower0 in _BY_GRAPH.get(graph, []) for r in tower0.records]


rewrites = global_batch_ops


def is_global(tensor) -> bool:
  """Whether tower 0's `tensor` is the global batch's (made so by a
  rewrite, or computed from such values only): the same in every tower,
  so one copy of it, not the towers' concatenation, is one device's."""
  if not isinstance(tensor, tf.Tensor):
    return False
  return any(tower0.kinds.get(tensor.ref()) == kinds.UNIFORM and
             tower0.records for tower0 in _BY_GRAPH.get(tensor.graph, []))


def global_values(tensors) -> bool:
  """Whether tower 0's `tensors` are all the global batch's, made so by
  the rewrite (or computed from such values): a write of them is one
  device's write, made once."""
  towers0 = _BY_GRAPH.get(tf1.get_default_graph(), [])
  if not towers0 or not tensors:
    return False
  tower0 = towers0[-1]
  return all(tower0.kinds.get(t.ref(), kinds.UNIFORM).is_uniform
             for t in tensors) and any(
                 t.ref() in tower0.global_values for t in tensors)


def tower_records(built: list) -> list:
  """Every tower's records (tests: the towers decided alike)."""
  return [[(r.op_type, r.how, r.gathered, r.statistics) for r in t.records]
          for t in built]




def unknown_batch(split):
  """`split` with every dense leaf's batch size unknown to the graph.

  A shard's static size would fold into constants (`tf.shape(x)`,
  `tf.ones_like(x)`, `tf.eye(n)` of a fully known shape are constants), so
  the table could not tell them from the shard's; and towers of different
  sizes would build different graphs. With the size unknown, every tower
  builds the same ops, as one device does on a batch of unknown size.
  """
  def hide(leaf):
    if (isinstance(leaf, tf.Tensor) and leaf.shape.rank and
        leaf.shape[0] is not None):
      return tf1.placeholder_with_default(leaf, [None] + leaf.shape[1:])
    return leaf
  shards = [tf.nest.map_structure(hide, shard) for shard in split.shards]
  return dataclasses.replace(split, shards=shards)
