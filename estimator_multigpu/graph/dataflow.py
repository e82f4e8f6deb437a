"""What a tower's tensors are, read from the graph's structure.

`multi_gpu` makes what the user reads (metrics, summaries, predictions) one
device's, which depends on whether a tensor holds one row per example of the
tower's shard or a statistic of the shard. This module answers that from the
graph alone (op types, shapes and data edges; never op names):

- *per-example* (`ROWS`): derived from the shard, with a dimension that is the
  shard's (unknown when the graph is built, or equal to its size);
- *shard statistic* (`STATISTIC`): a floating-point value derived from the
  shard without such a dimension (a `reduce_mean` of the loss, a batch mean);
- *global* (`GLOBAL`): computed from a cross-tower collective (`emg.
  cross_tower_sum`, `cross_tower_concat`), so the same in every tower;
- `NONE`: not derived from the shard (variables, constants, shapes).

A per-example tensor computed from a shard statistic (x - mean over the
shard, a list weight that is the shard's average, a softmax whose axis is
the batch) *couples* the shard's examples: each tower gets a different
value than one device would.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional

import tensorflow as tf

NONE, ROWS, STATISTIC, GLOBAL = "none", "rows", "statistic", "global"

_SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "BroadcastArgs",
                        "BroadcastGradientArgs"})
# Ops that reduce along the last axis (the batch's, for a vector of scores).
_LAST_AXIS_OPS = frozenset({"Softmax", "LogSoftmax"})


def is_collective(op: tf.Operation) -> bool:
  """A cross-tower collective (its output is the same in every tower)."""
  return op.type.startswith("Collective") or op.type.startswith("Nccl")


def data_ancestors(roots: Iterable[tf.Tensor],
                   stop: frozenset = frozenset()) -> set:
  """The ops the roots are computed from, along data edges only."""
  seen, stack = set(), [t.op for t in roots]
  while stack:
    op = stack.pop()
    if op in seen or op in stop:
      continue
    seen.add(op)
    stack.extend(t.op for t in op.inputs)
  return seen


@dataclasses.dataclass
class Coupling:
  """An op that makes per-example values out of a shard statistic."""
  op: tf.Operation
  statistic: Optional[tf.Tensor]  # the shard statistic it reads.

  def describe(self) -> str:
    if self.statistic is None:
      return f"a {self.op.type} along the batch axis"
    return (f"a {self.op.type} of per-example values with a statistic of the "
            f"shard (a {self.statistic.op.type}, shape {self.statistic.shape})")


class ShardAnalysis:
  """Classifies the tensors of one tower relative to its shard.

  Args:
    shard_tensors: the tower's inputs (the leaves of its features and
      labels); SparseTensors count by their components.
    shard_size: the shard's static size, or None.
  """

  def __init__(self, shard_tensors: Iterable[tf.Tensor],
               shard_size: Optional[int]):
    self._status = {t.ref(): ROWS for t in shard_tensors}
    self._size = shard_size
    self.couplings: list = []

  def status(self, tensor: tf.Tensor) -> str:
    """The tensor's class (`ROWS`, `STATISTIC`, `GLOBAL` or `NONE`)."""
    if tensor.ref() not in self._status:
      self._classify(tensor)
    return self._status[tensor.ref()]

  def is_rows(self, tensor: tf.Tensor) -> bool:
    return self.status(tensor) == ROWS

  def _classify(self, root: tf.Tensor) -> None:
    """Classifies `root` and its ancestors, inputs first (no recursion)."""
    stack = [(root.op, False)]
    while stack:
      op, inputs_done = stack.pop()
      if all(t.ref() in self._status for t in op.outputs):
        continue
      pending = [t.op for t in op.inputs if t.ref() not in self._status]
      if pending and not inputs_done:
        stack.append((op, True))
        stack.extend((p, False) for p in pending)
        continue
      for index, output in enumerate(op.outputs):
        self._status[output.ref()] = (
            self._status.get(op.inputs[index].ref(), NONE)
            if op.type == "IdentityN" else self._op_status(op, output))

  def _op_status(self, op: tf.Operation, output: tf.Tensor) -> str:
    inputs = [self._status.get(t.ref(), NONE) for t in op.inputs]
    if is_collective(op):
      return GLOBAL
    if op.type in _SHAPE_OPS or not inputs:
      return NONE
    rows_shape = self._rows_shaped(output) and not _reduces_batch_axis(op)
    if STATISTIC in inputs:
      return self._from_statistic(op, output, inputs, rows_shape)
    if ROWS in inputs:
      if rows_shape:
        self._check_batch_axis(op)
        return ROWS
      return STATISTIC if output.dtype.is_floating else NONE
    return GLOBAL if GLOBAL in inputs else NONE

  def _from_statistic(self, op, output, inputs, rows_shape) -> str:
    """A statistic with per-example values is a coupling; alone it stays a
    statistic whatever its shape."""
    if rows_shape and ROWS in inputs:
      statistic = op.inputs[inputs.index(STATISTIC)]
      if statistic.dtype.is_floating:
        self.couplings.append(Coupling(op, statistic))
      return ROWS
    return STATISTIC if output.dtype.is_floating else NONE

  def _check_batch_axis(self, op: tf.Operation) -> None:
    """A softmax over a vector of per-example scores couples the batch."""
    if op.type not in _LAST_AXIS_OPS:
      return
    shape = op.inputs[0].shape
    producer = op.inputs[0].op
    if shape.rank == 1 or (producer.type == "Transpose" and
                           _moves_first_axis_last(producer)):
      self.couplings.append(Coupling(op, None))

  def _rows_shaped(self, tensor: tf.Tensor) -> bool:
    shape = tensor.shape
    if shape.rank is None:
      return True
    return any(d is None or d == self._size for d in shape.as_list())


_REDUCTIONS = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "All", "Any",
                         "ArgMax", "ArgMin", "EuclideanNorm"})


def _reduces_batch_axis(op: tf.Operation) -> bool:
  """A reduction over axis 0 (the batch axis of a per-example tensor)."""
  if op.type not in _REDUCTIONS:
    return False
  axes = tf.get_static_value(op.inputs[1])
  rank = op.inputs[0].shape.rank
  if axes is None or rank is None:
    return False
  return any(int(a) % rank == 0 for a in tf.nest.flatten(axes.tolist())) or (
      rank == 0)


def _moves_first_axis_last(transpose: tf.Operation) -> bool:
  perm = tf.get_static_value(transpose.inputs[1])
  return perm is not None and len(perm) > 1 and int(perm[-1]) == 0


def shard_leaves(shard) -> list:
  """The dense tensors a shard (features, labels) is made of."""
  leaves = []
  for leaf in tf.nest.flatten(shard, expand_composites=True):
    if isinstance(leaf, tf.Tensor):
      leaves.append(leaf)
  return leaves


def static_size(leaves: list) -> Optional[int]:
  """The shard's static number of examples, if the graph knows it."""
  for leaf in leaves:
    if leaf.shape.rank and leaf.shape[0] is not None:
      return int(leaf.shape[0])
  return None


def shard_analysis(shard) -> ShardAnalysis:
  """A `ShardAnalysis` of one tower's shard (features, labels)."""
  leaves = shard_leaves(shard)
  return ShardAnalysis(leaves, static_size(leaves))
