"""What a tower's tensors are relative to its shard, read from the graph.

`multi_gpu` makes what the user reads (metrics, summaries, predictions) one
device's, which depends on whether a tensor holds one row per example of the
tower's shard or a statistic of the shard. `ShardAnalysis` answers that from
the graph alone (op types, shapes and data edges; never op names):

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
value than one device would (`Coupling`). How a statistic combines over the
towers is `shard_statistics`.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional

import numpy as np
import tensorflow as tf

from estimator_multigpu.graph import dataflow

NONE, ROWS, STATISTIC, GLOBAL = "none", "rows", "statistic", "global"
# Ops whose per-example output uses a statistic of the shard only as a
# numerical shift that what follows undoes (`cross_tower.moments` centers
# each shard on its own mean; the sums over the towers remove it): no
# coupling. `mark_shift_invariant` adds one.
SHIFT_INVARIANT = "estimator_multigpu_shift_invariant_ops"


def mark_shift_invariant(op: tf.Operation) -> None:
  """Declares `op`'s use of a shard statistic undone downstream."""
  tf.compat.v1.add_to_collection(SHIFT_INVARIANT, op)


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
    self._shift_invariant: set = set()  # `_undone`'s copy of the marks.
    self.couplings: list = []

  def status(self, tensor: tf.Tensor) -> str:
    """The tensor's class (`ROWS`, `STATISTIC`, `GLOBAL` or `NONE`)."""
    if tensor.ref() not in self._status:
      self._classify(tensor)
    return self._status[tensor.ref()]

  @property
  def size(self) -> Optional[int]:
    """The shard's static number of examples, or None."""
    return self._size

  def is_rows(self, tensor: tf.Tensor) -> bool:
    return self.status(tensor) == ROWS

  def mark(self, tensor: tf.Tensor, kind) -> None:
    """Declares what a rewrite on the global batch returned (`kind`, a
    `global_batch.kinds.Kind`): per-example rows, else global."""
    self._status[tensor.ref()] = ROWS if kind.is_rows else GLOBAL

  def mark_global(self, tensor: tf.Tensor) -> None:
    """Declares `tensor` the global batch's (a readout's stub,
    `global_calls`)."""
    self._status[tensor.ref()] = GLOBAL

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
    if dataflow.is_collective(op):
      return GLOBAL
    if op.type in dataflow.SHAPE_OPS or not inputs:
      return NONE
    rows_shape = self._rows_shaped(output) and not _reduces_batch_axis(op)
    if ROWS in inputs and output is op.outputs[0]:
      self._check_batch_axis(op)
    if STATISTIC in inputs:
      return self._from_statistic(op, output, inputs, rows_shape)
    if ROWS in inputs:
      if rows_shape:
        return ROWS
      return STATISTIC if output.dtype.is_floating else NONE
    return GLOBAL if GLOBAL in inputs else NONE

  def _from_statistic(self, op, output, inputs, rows_shape) -> str:
    """A statistic with per-example values is a coupling; alone it stays a
    statistic whatever its shape."""
    if rows_shape and ROWS in inputs:
      statistic = op.inputs[inputs.index(STATISTIC)]
      if statistic.dtype.is_floating and not self._undone(op):
        self.couplings.append(Coupling(op, statistic))
      return ROWS
    return STATISTIC if output.dtype.is_floating else NONE

  def _undone(self, op: tf.Operation) -> bool:
    """Whether `op` is marked `mark_shift_invariant` (the graph's marks are
    read again only when some were added since)."""
    marks = op.graph.get_collection_ref(SHIFT_INVARIANT)
    if len(marks) != len(self._shift_invariant):
      self._shift_invariant = set(marks)
    return op in self._shift_invariant

  def _check_batch_axis(self, op: tf.Operation) -> None:
    """An op along the batch axis of per-example values (a softmax, top_k
    or cumulative sum over a vector of scores) couples the batch, whatever
    its outputs are (top_k's indices too)."""
    if op.type in dataflow.CUMULATIVE:
      rank = op.inputs[0].shape.rank
      if rank is None or _static_axis(op) != rank - 1:
        return
    elif op.type not in dataflow.LAST_AXIS_OPS:
      return
    if self._batch_is_last(op.inputs[0]):
      self.couplings.append(Coupling(op, None))

  def _batch_is_last(self, tensor: tf.Tensor) -> bool:
    """The last axis of `tensor` is the batch's: a vector, the batch moved
    last by a transpose, or every axis before the last fixed and not the
    shard's ([1, batch] from a reshape, expand_dims or a swap of axes)."""
    shape, producer = tensor.shape, tensor.op
    if shape.rank == 1:
      return True
    if not shape.rank or not self._is_batch_dim(shape[-1]):
      return False
    if producer.type == "Transpose" and _moves_first_axis_last(producer):
      return True
    return not any(d is None or self._is_batch_dim(d) for d in shape[:-1])

  def _is_batch_dim(self, dim) -> bool:
    return dim is None or dim == self._size

  def _rows_shaped(self, tensor: tf.Tensor) -> bool:
    shape = tensor.shape
    if shape.rank is None:
      return True
    return any(d is None or d == self._size for d in shape.as_list())


def _reduces_batch_axis(op: tf.Operation) -> bool:
  """A reduction over axis 0 (the batch axis of a per-example tensor)."""
  if op.type not in dataflow.REDUCTIONS:
    return False
  axes = tf.get_static_value(op.inputs[1])
  rank = op.inputs[0].shape.rank
  if axes is None or rank is None:
    return False
  return any(int(a) % rank == 0 for a in tf.nest.flatten(axes.tolist())) or (
      rank == 0)


def _static_axis(op: tf.Operation) -> Optional[int]:
  """The axis (a second input) an op works along, made non-negative."""
  axis, rank = tf.get_static_value(op.inputs[1]), op.inputs[0].shape.rank
  if axis is None or rank is None or np.ndim(axis) > 1 or np.size(axis) != 1:
    return None
  return int(np.reshape(axis, [])) % max(rank, 1)


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
  return ShardAnalysis(shard_leaves(shard), shard_size(shard))


def shard_size(shard) -> Optional[int]:
  """The shard's static number of examples, from its dense tensors (a
  SparseTensor's components have other first dimensions)."""
  return static_size([leaf for leaf in tf.nest.flatten(shard)
                      if isinstance(leaf, tf.Tensor)])
