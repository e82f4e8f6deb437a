"""What a hook fetches, paired over the towers: the global batch's value.

Hooks are kept once, from tower 0 (contract item 9), so a tensor a hook
fetches is tower 0's. `GlobalFetches` pairs it with the same tensor of every
other tower (the same op type at the same position in the tower's ops, same
dtype; a per-example tensor may differ in its first dimension) and gives its
global batch's value:

    a per-example tensor (`tensor_kinds.ROWS`): every tower's, concatenated
                                                along axis 0 in tower order
                                                (= input order)
    a statistic of the shard (a scalar):        combined as `readouts.Readouts`
                                                combines it (loss weight,
                                                nᵢ/n, Σ)

either as a tensor when the graph is built (`global_tensor`), or from the
values of every tower's tensor at run time, once the graph is final
(`pairing`, then `Pairing.combine`); `hook_rewrites` puts them where hooks
read. A tensor that cannot be paired with every tower keeps tower 0's value
and is a WARNING naming the hook and the tensor, once per hook and tensor.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu.graph import dataflow
from estimator_multigpu.graph import tensor_kinds
from estimator_multigpu.graph import warn_once

ROWS = "rows"
_FIX = ("compute it the same way in every tower (not under a condition on "
        "the tower), or gather it over the global batch with "
        "emg.cross_tower_concat / emg.cross_tower_sum")


@dataclasses.dataclass
class Pairing:
  """Tower 0's tensor with its counterpart in every tower.

  Attributes:
    kind: `ROWS`, or how a statistic combines ("loss", "mean", "sum").
    tensors: every tower's tensor, tower 0's first.
    weights: a statistic's weight per tower (floats or tensors).
  """
  kind: str
  tensors: list
  weights: list = dataclasses.field(default_factory=list)

  def extra_fetches(self) -> list:
    """What to fetch besides tower 0's tensor to combine it at run time."""
    return self.tensors[1:] + [w for w in self.weights
                               if isinstance(w, tf.Tensor)]

  def combine(self, first, extra: list):
    """The global value from tower 0's value and `extra_fetches`' values."""
    count = len(self.tensors) - 1
    values = [np.asarray(first)] + [np.asarray(v) for v in extra[:count]]
    if self.kind == ROWS:
      return np.concatenate(values, axis=0)
    fetched = iter(extra[count:])
    weights = np.array([next(fetched) if isinstance(w, tf.Tensor) else w
                        for w in self.weights], np.float64)
    if self.kind == "sum":
      weights = (weights > 0).astype(np.float64)
    total = sum(np.where(w == 0, 0.0, w * v) for w, v in zip(weights, values))
    return np.asarray(total, values[0].dtype)


class GlobalFetches:
  """Pairs tower 0's tensors with every tower's; builds the global ones.

  Args:
    readouts: a `readouts.Readouts` of these towers (scalar statistics).
    towers: the built towers.
    shares: each tower's share of the global batch, nᵢ / n.
    analysis: tower 0's `tensor_kinds.ShardAnalysis`.
    ranges: the `readouts.OpRanges` that recorded the towers' ops.
  """

  def __init__(self, readouts, towers: list, shares: list,
               analysis: tensor_kinds.ShardAnalysis, ranges, shards=()):
    self._readouts, self._towers, self._shares = readouts, towers, shares
    self._analysis, self._ranges = analysis, ranges
    # The towers' inputs (features, labels), leaf by leaf: a hook that
    # fetches them gets the global batch's.
    self._inputs = [tensor_kinds.shard_leaves(shard) for shard in shards]
    self._input_index = {t.ref(): i for i, t in enumerate(
        self._inputs[0] if self._inputs else [])}
    self._by_type: dict = {}
    self._concats: dict = {}
    self._pairings: dict = {}

  def global_tensor(self, tensor: tf.Tensor, what: str) -> Optional[tf.Tensor]:
    """The global batch's tensor in place of tower 0's (graph time), or None
    to keep it (not tower 0's shard's, or unpaired: warned)."""
    if not self._in_tower0(tensor):
      return None
    status = self._analysis.status(tensor)
    if status == tensor_kinds.STATISTIC:
      return self._readouts.combined(tensor, what)
    pairing = (self.pairing(tensor, what) if status == tensor_kinds.ROWS
               else None)
    if pairing is None:
      return None
    if tensor.ref() not in self._concats:
      with tf.name_scope("global_batch_readout"):
        self._concats[tensor.ref()] = tf.concat(pairing.tensors, axis=0)
    return self._concats[tensor.ref()]

  def pairing(self, tensor: tf.Tensor, what: str) -> Optional[Pairing]:
    """Tower 0's per-example tensor or statistic with every tower's (reads
    the graph only: usable once it is final); None when it is not tower 0's
    shard's or cannot be paired (warned)."""
    if not self._in_tower0(tensor):
      return None
    key = (what.split(".")[0], tensor.ref())
    if key not in self._pairings:  # at run time: once per hook and tensor.
      self._pairings[key] = self._pair(tensor, what)
    return self._pairings[key]

  def _pair(self, tensor: tf.Tensor, what: str) -> Optional[Pairing]:
    status = self._analysis.status(tensor)
    if tensor.ref() in self._input_index:
      return self._paired(tensor, what, ROWS, self._input_counterpart, [])
    if status == tensor_kinds.ROWS:
      return self._paired(tensor, what, ROWS, self._rows_counterpart, [])
    if status != tensor_kinds.STATISTIC or not tensor.dtype.is_floating:
      if status == tensor_kinds.NONE and dataflow.ancestors(
          [tensor]) & self._shard_ops():
        self._warn(tensor, what, None)  # an integer statistic, an argmax.
      return None
    kind = self._readouts.kind(tensor)
    weights = ([t.loss_weight for t in self._towers] if kind == "loss"
               else list(self._shares))
    return self._paired(tensor, what, kind, self._ranges.counterpart,
                        weights)

  def _paired(self, tensor, what, kind, counterpart, weights):
    others = [counterpart(tensor, i) for i in range(1, len(self._towers))]
    if kind is None or any(other is None for other in others):
      self._warn(tensor, what, kind)
      return None
    return Pairing(kind, [tensor] + others, weights)

  def _warn(self, tensor: tf.Tensor, what: str, kind) -> None:
    held = ("a per-example tensor" if kind == ROWS else "a statistic")
    warn_once.warn(
        ("hook fetch", what.split(".")[0], tensor.name),
        "hook %s fetches %s, %s of tower 0's shard that `multi_gpu` cannot "
        "pair with every tower (or combine over them): the hook sees tower "
        "0's shard only, not the global batch. Fix: %s.", what, tensor.name,
        held, _FIX)

  def _in_tower0(self, tensor) -> bool:
    return isinstance(tensor, tf.Tensor) and (
        self._ranges.in_tower(tensor, 0) or tensor.ref() in self._input_index)

  def _input_counterpart(self, tensor: tf.Tensor, index: int):
    return self._inputs[index][self._input_index[tensor.ref()]]

  def _shard_ops(self) -> set:
    return {t.op for t in (self._inputs[0] if self._inputs else [])}

  def _rows_counterpart(self, tensor: tf.Tensor,
                        index: int) -> Optional[tf.Tensor]:
    """Tower `index`'s tensor in the place of tower 0's per-example
    `tensor`: its first dimension is that tower's shard's."""
    mine, theirs = (self._typed(0, tensor.op.type),
                    self._typed(index, tensor.op.type))
    if tensor.op not in mine or len(mine) != len(theirs):
      return None
    other = theirs[mine.index(tensor.op)].outputs[tensor.value_index]
    if other.dtype != tensor.dtype or other.shape.rank != tensor.shape.rank:
      return None
    if other.shape.rank and not other.shape[1:].is_compatible_with(
        tensor.shape[1:]):
      return None
    return other

  def _typed(self, index: int, op_type: str) -> list:
    key = (index, op_type)
    if key not in self._by_type:
      self._by_type[key] = [op for op in self._ranges.ops.get(index, [])
                            if op.type == op_type]
    return self._by_type[key]

  def combine_summary(self, tensor: tf.Tensor, what: str) -> None:
    """A scalar summary op a hook holds (alone or merged) reads the global
    batch's scalar."""
    ops = ([t.op for t in tensor.op.inputs] if tensor.op.type ==
           "MergeSummary" else [tensor.op])
    for op in ops:
      if op.type == "ScalarSummary" and self._ranges.in_tower(op.outputs[0], 0):
        value = self._readouts.combined(op.inputs[1], what)
        if value is not None:
          compat.private(op, "_update_input")(1, value)
