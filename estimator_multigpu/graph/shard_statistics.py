"""How a statistic of a tower's shard combines over the towers.

A readout built once from the global batch (`global_calls`) feeds each
statistic of the shard it reads the global batch's value, which depends on
what the statistic is (`statistic_kind`): a mean of the shard's examples
(Σᵢ (nᵢ/n)·xᵢ), a sum or a count (Σᵢ xᵢ), a max or a min, or a ratio of
two of them (the numerator's global value over the denominator's,
`ratio_parts`). `whole_shard` says
whether per-example values hold every example of the shard, each from its
own values; `is_count` finds a count of the shard's examples. What a tensor
is relative to the shard (per-example, statistic) is `tensor_kinds`.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from estimator_multigpu.graph import dataflow
from estimator_multigpu.graph import tensor_kinds

MEAN, SUM, MAX, MIN, RATIO = "mean", "sum", "max", "min", "ratio"
_ROWS, _STATISTIC = tensor_kinds.ROWS, tensor_kinds.STATISTIC
_KIND_OF_REDUCTION = {"Mean": MEAN, "Sum": SUM, "Max": MAX, "Min": MIN}
_UNDECIDED = object()  # `_kind_from_examples`: read it from the statistics.


def strip_pass_through(tensor: tf.Tensor) -> tf.Tensor:
  """`tensor` before casts, identities and reshapes (of the same values)."""
  return dataflow.before(tensor, dataflow.SAME_VALUES_OR_DEFAULT)


def statistic_kind(tensor: tf.Tensor, analysis: tensor_kinds.ShardAnalysis,
                   known: Optional[dict] = None) -> Optional[str]:
  """How a shard statistic combines over the towers: `MEAN`, `SUM`, `MAX`,
  `MIN` of the shard's examples (a linear combination of means, a scaled
  sum, a count of the shard's examples), `RATIO` (a sum or mean over a
  sum, count or mean: a weighted mean, `ratio_parts`), or None for any
  other statistic (a variance, a sum of ratios): the one inference left when
  a readout is built once from the global batch. `known` maps tensors
  (`Tensor.ref()`) whose kind is given (the loss terms) to it."""
  known = known or {}
  if tensor.ref() in known:
    return known[tensor.ref()]
  kind = _kind_from_examples(tensor, analysis, known)
  if kind is not _UNDECIDED:
    return kind
  return _kind_from_statistics(tensor.op, analysis, known)


def _kind_from_examples(tensor: tf.Tensor,
                        analysis: tensor_kinds.ShardAnalysis, known: dict):
  """The kind of a statistic read from the shard's examples themselves (a
  count, a ratio of sums, a mean, a histogram, a reduction of per-example
  values), or `_UNDECIDED` for one computed from other statistics."""
  if is_count(tensor, analysis):
    return SUM
  if ratio_parts(tensor, analysis, known) is not None:
    return RATIO
  if _mean_of_static_rows(tensor, analysis):
    return MEAN
  op, status = tensor.op, analysis.status
  if op.type in dataflow.SUMS_BY_GROUP and any(
      status(t) == _ROWS for t in op.inputs):
    return SUM  # a histogram: per-group sums over the examples.
  if op.type in _KIND_OF_REDUCTION and status(op.inputs[0]) == _ROWS:
    return (_KIND_OF_REDUCTION[op.type]
            if whole_shard(op.inputs[0], analysis) else None)
  return _UNDECIDED


def _kind_from_statistics(op: tf.Operation,
                          analysis: tensor_kinds.ShardAnalysis,
                          known: dict) -> Optional[str]:
  """The kind of `op`'s output computed from statistics of the shard: a
  sign change, a reduction, a signed sum or a scaling of them; else None."""
  statistics = [t for t in op.inputs if analysis.status(t) == _STATISTIC or
                is_count(t, analysis) or _integer_reduction(t, analysis)]
  if not statistics:
    return None
  kinds = [statistic_kind(t, analysis, known) for t in statistics]
  if op.type in dataflow.SAME_VALUES_UP_TO_SIGN:
    if kinds[0] == RATIO:  # combined from its own op's inputs only.
      return None
    return {MAX: MIN, MIN: MAX}.get(kinds[0], kinds[0]) if (
        op.type == "Neg") else kinds[0]
  if op.type in _KIND_OF_REDUCTION:  # over a statistic.
    return _reduced_kind(_KIND_OF_REDUCTION[op.type], kinds[0])
  if op.type in dataflow.SIGNED_SUMS:
    return _sum_kind(kinds, constants=len(statistics) < len(op.inputs))
  if op.type in dataflow.SCALES and len(statistics) == 1 and (
      op.type == "Mul" or statistics[0] is op.inputs[0]):
    return kinds[0] if kinds[0] in (MEAN, SUM) else None
  return None


def whole_shard(tensor: tf.Tensor,
                analysis: tensor_kinds.ShardAnalysis) -> bool:
  """Whether per-example `tensor` holds every example of the shard, each
  from its own values: no row of it selected (boolean_mask, gather, a slice
  or stride along the batch axis, top_k over it) and none coupled with a
  statistic of the shard (a variance's centered values, values divided
  by the shard's size)."""
  ancestors = dataflow.ancestors([tensor])
  if any(c.op in ancestors for c in analysis.couplings):
    return False
  spine = _rows_spine(tensor, analysis)
  return not any(_selects_rows(op) or any(
      is_count(t, analysis) for t in op.inputs if t.dtype.is_floating)
                 for op in spine)


def _rows_spine(tensor: tf.Tensor, analysis: tensor_kinds.ShardAnalysis,
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
    rows = [t for t in op.inputs if analysis.status(t) == _ROWS]
    if len(rows) != 1 or any(t.op.type in dataflow.WEIGHT_SOURCES or (
        t.op.type == "Identity" and t.op.inputs and
        t.op.inputs[0].op.type in dataflow.WEIGHT_SOURCES) for t in op.inputs):
      break
    current = rows[0]
  return spine


def _selects_rows(op: tf.Operation) -> bool:
  if op.type in dataflow.ROW_SELECTORS:
    return True
  if op.type in dataflow.GATHERS:
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


def _mean_of_static_rows(tensor: tf.Tensor,
                         analysis: tensor_kinds.ShardAnalysis) -> bool:
  """A sum of per-example values divided by their count, which TensorFlow
  folded into a constant (`tf.size` of a tensor of static shape)."""
  op = strip_pass_through(tensor).op
  if op.type not in dataflow.DIVISIONS:
    return False
  count = tf.get_static_value(op.inputs[1])
  total = strip_pass_through(op.inputs[0])
  if count is None or getattr(count, "ndim", 0) or total.op.type != "Sum":
    return False
  summed = total.op.inputs[0]
  while summed.op.type == "Sum" and analysis.status(summed) == _STATISTIC:
    summed = summed.op.inputs[0]  # a sum of a sum (TF's `weighted_loss`).
  return (analysis.status(summed) == _ROWS and summed.shape.is_fully_defined()
          and float(count) == summed.shape.num_elements())


def ratio_parts(tensor: tf.Tensor, analysis: tensor_kinds.ShardAnalysis,
                known: Optional[dict] = None) -> Optional[tuple]:
  """(numerator, denominator) of a sum or mean over the shard divided by a
  sum, count or mean over it (Σ w·x / Σ w, Σ x / n, a canned head's loss
  over its weights), else None; over the towers it is the numerator's
  global value over the denominator's."""
  op = strip_pass_through(tensor).op
  if op.type not in dataflow.DIVISIONS:
    return None
  parts = tuple(op.inputs[:2])
  if all(statistic_kind(t, analysis, known) in (SUM, MEAN) for t in parts):
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
  if kind in (MAX, MIN, RATIO) or (kind == SUM and constants):
    return None
  return kind


def _integer_reduction(tensor: tf.Tensor,
                       analysis: tensor_kinds.ShardAnalysis) -> bool:
  """An integer or boolean reduction over the shard's examples
  (`count_nonzero`, `reduce_any`): a statistic `ShardAnalysis` files as
  NONE (it is no float)."""
  op = strip_pass_through(tensor).op
  return (op.type in _KIND_OF_REDUCTION and
          not op.outputs[0].dtype.is_floating and
          analysis.status(op.inputs[0]) == _ROWS)


def is_count(tensor: tf.Tensor,
             analysis: tensor_kinds.ShardAnalysis) -> bool:
  """A count of the shard's examples: `tf.size` of a per-example tensor or
  the first entry of its `tf.shape` (cast or not)."""
  tensor = strip_pass_through(tensor)
  op = tensor.op
  if op.type == "Size":
    return analysis.status(op.inputs[0]) == _ROWS
  if op.type != "StridedSlice" or op.inputs[0].op.type != "Shape":
    return False
  begin = tf.get_static_value(op.inputs[1])
  return (begin is not None and list(begin) == [0] and
          op.get_attr("shrink_axis_mask") == 1 and
          analysis.status(op.inputs[0].op.inputs[0]) == _ROWS and
          tensor.shape.rank == 0)
