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

import numpy as np
import tensorflow as tf

NONE, ROWS, STATISTIC, GLOBAL = "none", "rows", "statistic", "global"

_SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "BroadcastArgs",
                        "BroadcastGradientArgs"})
# Ops over the last axis (the batch's, for a vector of scores): a softmax,
# top_k (tf.sort and tf.argsort are built on it).
_LAST_AXIS_OPS = frozenset({"Softmax", "LogSoftmax", "TopKV2", "TopK"})
# Ops along an axis given as their second input: cumulative sums (of a
# vector of scores; axis 0 of a larger tensor may be time, not the batch).
_ALONG_AXIS_OPS = frozenset({"Cumsum", "Cumprod", "CumulativeLogsumexp"})


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


def ancestors(ops: Iterable[tf.Operation]) -> set:
  """The ops `ops` depend on (themselves included), along data and control
  edges."""
  seen, stack = set(), list(ops)
  while stack:
    op = stack.pop()
    if op not in seen:
      seen.add(op)
      stack.extend(t.op for t in op.inputs)
      stack.extend(op.control_inputs)
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

  @property
  def size(self) -> Optional[int]:
    """The shard's static number of examples, or None."""
    return self._size

  def is_rows(self, tensor: tf.Tensor) -> bool:
    return self.status(tensor) == ROWS

  def mark_global(self, tensor: tf.Tensor) -> None:
    """Declares `tensor` the global batch's (a readout's stub, `global_calls`)."""
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
    if is_collective(op):
      return GLOBAL
    if op.type in _SHAPE_OPS or not inputs:
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
      if statistic.dtype.is_floating:
        self.couplings.append(Coupling(op, statistic))
      return ROWS
    return STATISTIC if output.dtype.is_floating else NONE

  def _check_batch_axis(self, op: tf.Operation) -> None:
    """An op along the batch axis of per-example values (a softmax, top_k
    or cumulative sum over a vector of scores) couples the batch, whatever
    its outputs are (top_k's indices too)."""
    if op.type in _ALONG_AXIS_OPS:
      rank = op.inputs[0].shape.rank
      if rank is None or _static_axis(op) != rank - 1:
        return
    elif op.type not in _LAST_AXIS_OPS:
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


# ------------------------------------------------ the kind of a statistic
MEAN, SUM, MAX, MIN, RATIO = "mean", "sum", "max", "min", "ratio"
_DIVISIONS = frozenset({"RealDiv", "DivNoNan", "Div"})
_PASS_THROUGH = frozenset({"Identity", "Cast", "Neg", "Reshape", "Squeeze",
                           "ExpandDims", "PlaceholderWithDefault"})
_LINEAR_SUMS = frozenset({"Add", "AddV2", "Sub", "AddN"})
_SCALES = frozenset({"Mul", "RealDiv", "DivNoNan", "Div"})
_KIND_OF_REDUCTION = {"Mean": MEAN, "Sum": SUM, "Max": MAX, "Min": MIN}
_SUMS_BY_GROUP = frozenset({"Bincount", "DenseBincount", "UnsortedSegmentSum",
                            "SegmentSum"})


def strip_pass_through(tensor: tf.Tensor) -> tf.Tensor:
  """`tensor` before casts, identities and reshapes (of the same values)."""
  while tensor.op.type in _PASS_THROUGH and tensor.op.type != "Neg":
    tensor = tensor.op.inputs[0]
  return tensor


def statistic_kind(tensor: tf.Tensor, analysis: ShardAnalysis,
                   known: Optional[dict] = None) -> Optional[str]:
  """How a shard statistic combines over the towers: `MEAN`, `SUM`, `MAX`,
  `MIN` of the shard's examples (a linear combination of means, a scaled
  sum, a count of the shard's examples), `RATIO` (a sum over a sum or a
  count: a weighted mean, `ratio_parts`), or None for any other statistic
  (a ratio of two means, a variance): that is the one inference left when
  a readout is built once from the global batch. `known` maps tensors
  (`Tensor.ref()`) whose kind is given (the loss terms) to it."""
  known = known or {}
  if tensor.ref() in known:
    return known[tensor.ref()]
  if is_count(tensor, analysis):
    return SUM
  if ratio_parts(tensor, analysis, known) is not None:
    return RATIO
  if _mean_of_static_rows(tensor, analysis):
    return MEAN
  op, status = tensor.op, analysis.status
  if op.type in _SUMS_BY_GROUP and any(status(t) == ROWS for t in op.inputs):
    return SUM  # a histogram: per-group sums over the examples.
  if op.type in _KIND_OF_REDUCTION and status(op.inputs[0]) == ROWS:
    return (_KIND_OF_REDUCTION[op.type]
            if whole_shard(op.inputs[0], analysis) else None)
  statistics = [t for t in op.inputs if status(t) == STATISTIC or
                is_count(t, analysis) or _integer_reduction(t, analysis)]
  kinds = [statistic_kind(t, analysis, known) for t in statistics]
  if op.type in _PASS_THROUGH and statistics:
    return {MAX: MIN, MIN: MAX}.get(kinds[0], kinds[0]) if (
        op.type == "Neg") else kinds[0]
  if op.type in _KIND_OF_REDUCTION and statistics:  # over a statistic.
    return _reduced_kind(_KIND_OF_REDUCTION[op.type], kinds[0])
  if op.type in _LINEAR_SUMS and statistics:
    return _sum_kind(kinds, constants=len(statistics) < len(op.inputs))
  if op.type in _SCALES and len(statistics) == 1 and (
      op.type == "Mul" or statistics[0] is op.inputs[0]):
    return kinds[0] if kinds[0] in (MEAN, SUM) else None
  return None


# Ops that keep some of the rows of a per-example tensor (boolean_mask,
# gather, top_k of a vector of scores, unique): a reduction after them is
# not over the shard's examples.
_ROW_SELECTORS = frozenset({"Where", "Unique", "UniqueV2",
                            "DynamicPartition", "ListDiff", "SetDiff1d"})


def whole_shard(tensor: tf.Tensor, analysis: ShardAnalysis) -> bool:
  """Whether per-example `tensor` holds every example of the shard, each
  from its own values: no row of it selected (boolean_mask, gather, a slice
  or stride along the batch axis, top_k over it) and none coupled with a
  statistic of the shard (a variance's centered values, values divided
  by the shard's size)."""
  ancestors = data_ancestors([tensor])
  if any(c.op in ancestors for c in analysis.couplings):
    return False
  spine = _rows_spine(tensor, analysis)
  return not any(_selects_rows(op) or any(
      is_count(t, analysis) for t in op.inputs if t.dtype.is_floating)
                 for op in spine)


_LAYER_INPUTS = frozenset({"ReadVariableOp", "VariableV2", "VarHandleOp"})


def _rows_spine(tensor: tf.Tensor, analysis: ShardAnalysis,
                depth: int = 8) -> list:
  """The ops the per-example `tensor` comes from while each has one
  per-example input, up to a layer (an op reading a variable): where a
  selection of rows (a mask, a slice, top_k) would change which examples it
  holds. Beyond a layer, rows are the model's (feature columns gather and
  regroup sparse ids on their way to one row per example)."""
  spine, current = [], tensor
  for _ in range(depth):
    op = current.op
    spine.append(op)
    rows = [t for t in op.inputs if analysis.status(t) == ROWS]
    if len(rows) != 1 or any(t.op.type in _LAYER_INPUTS or (
        t.op.type == "Identity" and t.op.inputs and
        t.op.inputs[0].op.type in _LAYER_INPUTS) for t in op.inputs):
      break
    current = rows[0]
  return spine


def _selects_rows(op: tf.Operation) -> bool:
  if op.type in _ROW_SELECTORS:
    return True
  if op.type in ("GatherV2", "Gather", "GatherNd", "ResourceGather"):
    axis = (tf.get_static_value(op.inputs[2]) if op.type == "GatherV2"
            else 0)
    return axis is None or int(axis) == 0
  if op.type == "TopKV2":
    return op.inputs[0].shape.rank in (None, 1)
  if op.type == "StridedSlice":
    return not _keeps_first_axis(op)
  if op.type == "Slice":
    begin, size = (tf.get_static_value(t) for t in op.inputs[1:3])
    rows = op.inputs[0].shape[0] if op.inputs[0].shape.rank else None
    return begin is None or size is None or begin[0] != 0 or (
        size[0] != -1 and size[0] != rows)
  return False


def _keeps_first_axis(op: tf.Operation) -> bool:
  """A strided slice that keeps axis 0 whole (`x[:, 0]`, `x[..., :2]`)."""
  if op.get_attr("ellipsis_mask") & 1:
    return True
  begin, end, strides = (tf.get_static_value(t) for t in op.inputs[1:4])
  if begin is None or strides is None or op.get_attr("shrink_axis_mask") & 1:
    return False
  whole_start = op.get_attr("begin_mask") & 1 or begin[0] == 0
  return bool(whole_start and op.get_attr("end_mask") & 1 and
              strides[0] == 1)


def _mean_of_static_rows(tensor: tf.Tensor, analysis: ShardAnalysis) -> bool:
  """A sum of per-example values divided by their count, which TensorFlow
  folded into a constant (`tf.size` of a tensor of static shape)."""
  op = strip_pass_through(tensor).op
  if op.type not in _DIVISIONS:
    return False
  count = tf.get_static_value(op.inputs[1])
  total = strip_pass_through(op.inputs[0])
  if count is None or getattr(count, "ndim", 0) or total.op.type != "Sum":
    return False
  summed = total.op.inputs[0]
  while summed.op.type == "Sum" and analysis.status(summed) == STATISTIC:
    summed = summed.op.inputs[0]  # a sum of a sum (TF's `weighted_loss`).
  return (analysis.status(summed) == ROWS and summed.shape.is_fully_defined()
          and float(count) == summed.shape.num_elements())


def ratio_parts(tensor: tf.Tensor, analysis: ShardAnalysis,
                known: Optional[dict] = None) -> Optional[tuple]:
  """(numerator, denominator) of a sum over the shard divided by a sum or
  count over it (Σ w·x / Σ w, Σ x / n), else None; over the towers it is
  Σᵢ numeratorᵢ / Σᵢ denominatorᵢ."""
  op = strip_pass_through(tensor).op
  if op.type not in _DIVISIONS:
    return None
  parts = tuple(op.inputs[:2])
  if all(statistic_kind(t, analysis, known) == SUM for t in parts):
    return parts
  return None


def _reduced_kind(reduction: str, kind: Optional[str]) -> Optional[str]:
  """A sum or mean over entries of a mean (sum) is a mean (sum); a max of
  maxima a max, a min of minima a min."""
  if reduction in (SUM, MEAN):
    return kind if kind in (SUM, MEAN) else None
  return kind if kind == reduction else None


def _sum_kind(kinds: list, constants: bool) -> Optional[str]:
  """A sum of means is a mean; of sums a sum (not plus a constant, which
  each tower would add once)."""
  kind = kinds[0] if len(set(kinds)) == 1 else None
  if kind in (MAX, MIN) or (kind == SUM and constants):
    return None
  return kind


def _integer_reduction(tensor: tf.Tensor, analysis: ShardAnalysis) -> bool:
  """An integer or boolean reduction over the shard's examples
  (`count_nonzero`, `reduce_any`): a statistic `ShardAnalysis` files as
  NONE (it is no float)."""
  op = strip_pass_through(tensor).op
  return (op.type in _KIND_OF_REDUCTION and
          not op.outputs[0].dtype.is_floating and
          analysis.status(op.inputs[0]) == ROWS)


def is_count(tensor: tf.Tensor, analysis: ShardAnalysis) -> bool:
  """A count of the shard's examples: `tf.size` of a per-example tensor or
  the first entry of its `tf.shape` (cast or not)."""
  tensor = strip_pass_through(tensor)
  op = tensor.op
  if op.type == "Size":
    return analysis.status(op.inputs[0]) == ROWS
  if op.type != "StridedSlice" or op.inputs[0].op.type != "Shape":
    return False
  begin = tf.get_static_value(op.inputs[1])
  return (begin is not None and list(begin) == [0] and
          op.get_attr("shrink_axis_mask") == 1 and
          analysis.status(op.inputs[0].op.inputs[0]) == ROWS and
          tensor.shape.rank == 0)
def shard_analysis(shard) -> ShardAnalysis:
  """A `ShardAnalysis` of one tower's shard (features, labels)."""
  return ShardAnalysis(shard_leaves(shard), shard_size(shard))


def shard_size(shard) -> Optional[int]:
  """The shard's static number of examples, from its dense tensors (a
  SparseTensor's components have other first dimensions)."""
  return static_size([leaf for leaf in tf.nest.flatten(shard)
                      if isinstance(leaf, tf.Tensor)])
