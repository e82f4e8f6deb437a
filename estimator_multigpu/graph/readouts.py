"""What the user reads in TRAIN and EVAL: summaries and hooks of the towers.

Summaries and hooks are kept once, from tower 0 (contract item 9); a scalar
the user summarizes or a hook fetches (the loss, a `reduce_mean` over the
shard's examples) is then tower 0's shard's. This module makes it the global
batch's: each such tensor of tower 0 is paired with the same tensor of every
other tower (the same op type at the same position in the tower's ops, same
dtype and shape) and replaced, where the user reads it, by

    the loss, a term in LOSSES:      Σᵢ (tower i's loss weight) · xᵢ
    a mean over the shard's examples: Σᵢ (nᵢ / n) · xᵢ
    a sum over the shard's examples:  Σᵢ xᵢ

(plus batch-independent terms, for a mean). Where it is read: the input of
tower 0's `tf.compat.v1.summary.scalar` ops, and the attributes of tower 0's
hooks that hold the tensor or its name (directly, or in a dict, list or
tuple: `LoggingTensorHook`, a custom `SessionRunHook` that keeps
`self.loss`; per-example tensors and run-time fetches too: `hook_rewrites`).
A shard statistic that is not a mean or a sum (a max, a ratio
of two means) stays tower 0's and is warned about; non-scalar summaries
(histograms, images) are tower 0's.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu.graph import dataflow
from estimator_multigpu.graph import hook_fetches
from estimator_multigpu.graph import hook_rewrites
from estimator_multigpu.graph import shard_statistics
from estimator_multigpu.graph import state_updates
from estimator_multigpu.graph import tensor_kinds
from estimator_multigpu.graph import warn_once

tf1 = tf.compat.v1



class OpRanges:
  """The ops each tower created (a tower scope factory records them)."""

  def __init__(self):
    self.ops: dict = {}
    self._by_type: dict = {}
    self._sets: dict = {}

  def scope_factory(self, tower):
    """Records the ops created while `tower` is built."""
    return self._recording(tower.index)

  @contextlib.contextmanager
  def _recording(self, index: int):
    graph = tf1.get_default_graph()
    start = len(graph.get_operations())
    try:
      yield
    finally:
      self.ops[index] = graph.get_operations()[start:]

  def drop(self, ops: set) -> None:
    """Forgets `ops` (readouts built once, in one tower only)."""
    self.ops = {i: [op for op in tower if op not in ops]
                for i, tower in self.ops.items()}
    self._by_type.clear()
    self._sets.clear()

  def in_tower(self, tensor: tf.Tensor, index: int) -> bool:
    """Whether tower `index` created `tensor`."""
    if index not in self._sets:
      self._sets[index] = set(self.ops.get(index, []))
    return tensor.op in self._sets[index]

  def counterpart(self, tensor: tf.Tensor, index: int) -> Optional[tf.Tensor]:
    """Tower `index`'s tensor in the place of tower 0's `tensor`."""
    mine, theirs = self._typed(0, tensor.op.type), self._typed(
        index, tensor.op.type)
    if tensor.op not in mine or len(mine) != len(theirs):
      return None
    op = theirs[mine.index(tensor.op)]
    other = op.outputs[tensor.value_index]
    if other.dtype != tensor.dtype or other.shape != tensor.shape:
      return None
    return other

  def _typed(self, index: int, op_type: str) -> list:
    key = (index, op_type)
    if key not in self._by_type:
      self._by_type[key] = [op for op in self.ops.get(index, [])
                            if op.type == op_type]
    return self._by_type[key]


class Readouts:
  """Builds the global-batch value of tower 0's scalars (see module doc)."""

  def __init__(self, towers: list, shares: list,
               analysis: tensor_kinds.ShardAnalysis, ranges: OpRanges):
    self._towers, self._shares = towers, shares
    self._analysis, self._ranges = analysis, ranges
    self._combined: dict = {}

  def combined(self, tensor: tf.Tensor, what: str) -> Optional[tf.Tensor]:
    """The global batch's value of tower 0's `tensor`, or None to keep it."""
    if not isinstance(tensor, tf.Tensor) or tensor.ref() in self._combined:
      return self._combined.get(getattr(tensor, "ref", lambda: None)())
    value = self._build(tensor, what)
    self._combined[tensor.ref()] = value
    return value

  def _build(self, tensor: tf.Tensor, what: str) -> Optional[tf.Tensor]:
    if (not tensor.dtype.is_floating or not self._ranges.in_tower(tensor, 0)
        or self._analysis.status(tensor) != tensor_kinds.STATISTIC):
      return None
    pieces = [tensor] + [self._ranges.counterpart(tensor, i)
                         for i in range(1, len(self._towers))]
    weights = self._weights(tensor)
    if weights is None or any(p is None for p in pieces):
      warn_once.warn(
          ("statistic", what, tensor.name), "%s reads %s, a statistic of tower 0's shard that `multi_gpu` "
          "cannot combine over the towers (not a mean or a sum over the "
          "examples): it shows tower 0's shard. Compute it over the global "
          "batch with emg.cross_tower_sum / emg.global_ratio.", what,
          tensor.name)
      return None
    with tf.name_scope("global_batch_readout"):
      return tf.math.add_n([tf.math.multiply_no_nan(
          p, tf.cast(w, p.dtype)) for p, w in zip(pieces, weights)])

  def kind(self, tensor: tf.Tensor) -> Optional[str]:
    """How tower 0's statistic combines over the towers: "loss" (by the
    towers' loss weights), "mean", "sum", or None (it cannot)."""
    tower0 = self._towers[0]
    losses = [tower0.spec.loss] + list(
        tower0.collections.get(tf1.GraphKeys.LOSSES, []))
    if any(tensor is loss for loss in losses if loss is not None):
      return "loss"
    kind = shard_statistics.statistic_kind(tensor, self._analysis)
    return (kind if kind in (shard_statistics.MEAN, shard_statistics.SUM)
            else None)

  def _weights(self, tensor: tf.Tensor) -> Optional[list]:
    tower0 = self._towers[0]
    losses = [tower0.spec.loss] + list(
        tower0.collections.get(tf1.GraphKeys.LOSSES, []))
    if any(tensor is loss for loss in losses if loss is not None):
      return [t.loss_weight for t in self._towers]
    kind = shard_statistics.statistic_kind(tensor, self._analysis)
    if kind == shard_statistics.MEAN:
      return self._shares
    if kind == shard_statistics.SUM:
      return [_nonzero(share) for share in self._shares]
    return None


def _nonzero(share) -> Any:
  if isinstance(share, (int, float)):
    return 1.0 if share > 0 else 0.0
  return tf.cast(share > 0, tf.float32)


def combine_summaries(readouts: Readouts, tower0,
                      built: frozenset = frozenset()) -> None:
  """Tower 0's scalar summaries made without the summary APIs (a raw
  `ScalarSummary` op) show the global batch's value, by inference."""
  for summary in tower0.collections.get(tf1.GraphKeys.SUMMARIES, []):
    op = getattr(summary, "op", summary)
    if op.type != "ScalarSummary" or op in built:
      continue
    tag = tf.get_static_value(op.inputs[0])
    tag = tag.item() if hasattr(tag, "item") else tag
    tag = tag.decode() if isinstance(tag, bytes) else tag
    value = readouts.combined(op.inputs[1], f"summary {tag!r}")
    if value is not None:
      warn_once.warn(("inferred summary", tag),
                      "summary %r was not made through tf.summary / "
                      "tf.compat.v1.summary, so its value over the towers is "
                      "inferred from its ops (%s); make it with "
                      "tf.compat.v1.summary.scalar to build it once from the "
                      "global batch.", tag, value.op.name)
      compat.private(op, "_update_input")(1, value)


def combine(towers: list, shares: list, analysis: tensor_kinds.ShardAnalysis,
            ranges: OpRanges, built: frozenset = frozenset(),
            shards=()) -> None:
  """Tower 0's scalar summaries and hooks read the global batch's values
  (`built`: the ops summary APIs built once from the global batch;
  `shards`: the towers' inputs, which hooks may fetch too)."""
  if len(towers) < 2:
    return
  readouts = Readouts(towers, shares, analysis, ranges)
  combine_summaries(readouts, towers[0], built)
  fetches = hook_fetches.GlobalFetches(readouts, towers, shares, analysis,
                                       ranges, shards)
  spec = towers[0].spec
  for hooks in (spec.training_hooks, spec.training_chief_hooks,
                spec.evaluation_hooks, spec.prediction_hooks):
    hook_rewrites.global_batch_hooks(fetches, hooks)
  for summary in towers[0].collections.get(tf1.GraphKeys.SUMMARIES, []):
    op = getattr(summary, "op", summary)
    peers = _peers([op])
    if peers:
      compat.private(op, "_add_control_inputs")(peers)


def _peers(ops: list) -> list:
  """Towers 1..'s collectives matching those `ops` (tower 0's) reach: a
  summary is fetched without the other towers' ops, and a collective waits
  for every tower of its group (the 600 s timeout)."""
  return state_updates.peer_collectives(
      dataflow.ancestors(ops, control=True, per_output=True))


PREDICTION_FIX = (
    "compute the batch statistic over the global batch with the cross-tower "
    "tools, e.g. a softmax over the batch: m = tf.reduce_max(emg."
    "cross_tower_concat(x)); z = tf.exp(x - m); p = z / emg.cross_tower_sum("
    "tf.reduce_sum(z)) (docs/losses.md: 'What the user reads')")


def warn_coupled_predictions(predictions, analysis: tensor_kinds.ShardAnalysis
                             ) -> list:
  """Warns about predictions computed from a statistic of the shard.

  Returns:
    The keys warned about.
  """
  items = (predictions.items() if isinstance(predictions, dict)
           else [("predictions", predictions)])
  warned = []
  for key, tensor in items:
    if not isinstance(tensor, tf.Tensor):
      continue
    analysis.status(tensor)
    ancestors = dataflow.ancestors([tensor])
    coupling = next((c for c in analysis.couplings if c.op in ancestors), None)
    if coupling is not None:
      warned.append(key)
      warn_once.warn(
          ("prediction", key), "prediction %r couples the examples of the batch (%s): each tower "
          "computes it over its own shard, so it is not one device's. Fix: "
          "%s.", key, coupling.describe(), PREDICTION_FIX)
  return warned
