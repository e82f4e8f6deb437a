"""The op table's shape family: shapes, slices, joins, reshapes, gathers.

Part of `table`: the same verdicts. A shape vector of per-example rows
(`tf.shape(x)`) keeps the axis of the shard's size; what is shaped by it
(`tf.zeros(tf.shape(x))`, a random draw, a reshape) is per example; an
entry of it is the shard's size (`SUM`: the towers' sizes add up).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from estimator_multigpu.graph.global_batch import kinds as K
from estimator_multigpu.graph.global_batch.op_view import leads_with_minus_one
from estimator_multigpu.graph.global_batch.op_view import OpView
from estimator_multigpu.graph.global_batch.op_view import static_value

_BIG = 1 << 30


def shape(view: OpView) -> list:
  """`tf.shape` / `tf.size` / `tf.rank` of each input."""
  if view.type == "Rank":
    return [K.UNIFORM]
  out = []
  for kind in view.kinds[:view.num_outputs]:
    if view.type == "Size":
      out.append(K.SUM if kind.is_rows else
                 K.LOCAL_COUNT if kind.is_local else K.UNIFORM)
    elif kind.is_rows or kind.is_local:
      out.append(K.shape_of(kind.axis if kind.is_rows else 0, kind.is_local))
    else:
      out.append(K.UNIFORM)
  return out


def local(view: OpView):
  """Ops of rows counted by their values (`LOCAL`): kept per shard, except
  a reduction of them over the batch axis and their shape."""
  if view.type in ("Shape", "Size", "ShapeN"):
    return shape(view)
  if view.type in ("Sum", "Mean", "Max", "Min") and view.kinds[0].is_local:
    axes = view.axes(1, view.rank(0))
    if axes is not None and 0 in axes:
      return [K.SUM] if view.type == "Sum" else K.COMBINED
  if view.type in ("SparseToDense", "SparseTensorDenseMatMul"):
    dense_shape = view.kinds[1 if view.type == "SparseToDense" else 2]
    if dense_shape.is_shape and dense_shape.axis == 0:
      return [K.rows(0)]
  return [K.LOCAL] * view.num_outputs


def strided_slice(view: OpView):
  """Slices keeping the whole batch axis; an entry of a shape vector."""
  kind = view.kinds[0]
  if not all(k.is_uniform for k in view.kinds[1:]):
    return K.LOCALLY if any(k.is_statistic or k.is_shape
                            for k in view.kinds[1:]) else K.GLOBALLY
  if kind.is_statistic:
    return [kind]
  if not (kind.is_rows or kind.is_shape):
    return K.GLOBALLY
  spec = [view.const(i) for i in (1, 2, 3)]
  if any(s is None for s in spec) or view.rank(0) is None:
    return K.GLOBALLY
  if kind.is_shape:
    return _slice_of_shape(view, kind, *spec)
  mapped = _batch_axis_after_slice(view, kind.axis, *spec)
  return K.GLOBALLY if mapped is None else [K.rows(mapped)]


def _slice_of_shape(view, kind, begin, end, strides):
  length = view.inputs[0].shape[0]
  if length is None:
    return K.GLOBALLY
  positions = np.arange(length)
  mask = view.attr("shrink_axis_mask", 0)
  if mask & 1:
    index = int(begin[0]) % length
    return [K.count_of(kind) if index == kind.axis else K.UNIFORM]
  b = None if view.attr("begin_mask", 0) & 1 else int(begin[0])
  e = None if view.attr("end_mask", 0) & 1 else int(end[0])
  kept = list(positions[b:e:int(strides[0])])
  if kind.axis not in kept:
    return [K.UNIFORM]
  return [K.shape_of(kept.index(kind.axis), kind.ragged)]


def _batch_axis_after_slice(view, axis, begin, end, strides):
  """Where the batch axis lands when the slice keeps all of it, else None."""
  rank, n = view.rank(0), len(begin)
  masks = {m: view.attr(m, 0) for m in (
      "begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask",
      "shrink_axis_mask")}
  consumed = n - bin(masks["new_axis_mask"]).count("1") - (
      1 if masks["ellipsis_mask"] else 0)
  dim, out = 0, 0
  for i in range(n):
    bit = 1 << i
    if masks["ellipsis_mask"] & bit:
      span = rank - consumed
      if dim <= axis < dim + span:
        return out + axis - dim
      dim, out = dim + span, out + span
      continue
    if masks["new_axis_mask"] & bit:
      out += 1
      continue
    if dim == axis:
      whole = ((masks["begin_mask"] & bit or int(begin[i]) == 0) and
               (masks["end_mask"] & bit or int(end[i]) >= _BIG) and
               int(strides[i]) == 1 and not masks["shrink_axis_mask"] & bit)
      return out if whole else None
    out += 0 if masks["shrink_axis_mask"] & bit else 1
    dim += 1
  return out + axis - dim  # the batch axis is past the slice's entries.


def slice_op(view: OpView):
  """`tf.slice` keeping the whole batch axis."""
  kind = view.kinds[0]
  begin, size = view.const(1), view.const(2)
  if (kind.is_rows and begin is not None and size is not None and
      view.kinds[1].is_uniform and view.kinds[2].is_uniform and
      int(begin[kind.axis]) == 0 and int(size[kind.axis]) == -1):
    return [kind]
  length = view.inputs[0].shape[0] if view.rank(0) == 1 else None
  if kind.is_shape and begin is not None and size is not None and length:
    start = int(begin[0])  # a slice of a shape vector (_flatten_outer_dims)
    kept = list(range(length))[start:None if int(size[0]) == -1 else
                               start + int(size[0])]
    if kind.axis not in kept:
      return [K.UNIFORM]
    return [K.shape_of(kept.index(kind.axis), kind.ragged)]
  return K.GLOBALLY if not kind.is_statistic else K.LOCALLY


def reshape(view: OpView):
  """A reshape keeping the batch major on its axis (the axes before it
  unchanged, the rows of an example together)."""
  kind, target = view.kinds
  if kind.is_statistic and target.is_uniform:
    return [kind]
  if not kind.is_rows or not (target.is_uniform or target.is_shape):
    return K.LOCALLY if target.is_statistic or (
        target.is_shape and kind.is_uniform) else K.GLOBALLY
  if target.is_shape and target.axis == kind.axis == 0:
    return [K.LOCAL if target.ragged else kind]  # c·n rows of c·n.
  if kind.axis == 0 and target.is_uniform and leads_with_minus_one(
      view.inputs[1]):
    return [kind]  # [-1, ...]: the examples' rows stay together.
  before = view.inputs[0].shape[:kind.axis]
  inner_in = view.static_dims(0, kind.axis + 1)
  inner_out = view.out_static_dims(kind.axis + 1)
  out_shape = view.op.outputs[0].shape
  if (inner_in is None or inner_out is None or not before.is_fully_defined()
      or out_shape.rank is None or out_shape[:kind.axis] != before):
    return K.GLOBALLY
  a, b = int(np.prod(inner_in)), int(np.prod(inner_out))
  if a and b and (a % b == 0 or b % a == 0):
    return [kind]
  return K.GLOBALLY


def reshaped_rows(view: OpView):
  """The static shape one device gives `tf.reshape(x, [tf.shape(x)[0], -1,
  ...])` (the shard's size first, other entries static, one may be -1), with
  the batch axis of any size; None where the graph knows it already or the
  target is another one. One device's batch is static, so the -1 is
  inferred there; a tower's is not."""
  if view.type != "Reshape" or view.kinds[:2] != [K.rows(0), K.shape_of(0)]:
    return None
  out = view.op.outputs[0].shape
  target, inner = view.inputs[1], view.static_dims(0, 1)
  if (out.rank is None or out[1:].is_fully_defined() or inner is None or
      target.op.type != "Pack" or not _reads_batch(target.op.inputs[0])):
    return None
  entries = [static_value(t) for t in target.op.inputs[1:]]
  if any(e is None for e in entries) or [int(e) for e in entries].count(-1) > 1:
    return None
  known = int(np.prod([int(e) for e in entries if int(e) != -1]))
  total = int(np.prod(inner))
  if not known or total % known:
    return None
  return tf.TensorShape([None] + [total // known if int(e) == -1 else int(e)
                                  for e in entries])


def _reads_batch(entry) -> bool:
  """Whether `entry` is the size of a tensor's axis 0 (`tf.shape(x)[0]`)."""
  op = entry.op
  if op.type == "StridedSlice" and op.inputs[0].op.type == "Shape":
    begin = static_value(op.inputs[1])
    return begin is not None and np.size(begin) == 1 and int(
        np.ravel(begin)[0]) == 0
  return (op.type == "Unpack" and op.inputs[0].op.type == "Shape" and
          entry.value_index == 0)


def fill(view: OpView):
  """Filled to the shape of the shard's rows (`tf.zeros(tf.shape(x))`)."""
  dims, value = view.kinds
  if dims.is_shape and value.is_uniform:
    return [K.LOCAL if dims.ragged else K.rows(dims.axis)]
  return K.LOCALLY


def pack(view: OpView):
  """Per-example values stacked on another axis; a shape from a size."""
  rank = view.out_rank()
  axis = view.attr("axis", 0) % rank if rank else 0
  if all(k.is_rows for k in view.kinds) and len(set(view.kinds)) == 1:
    batch = view.kinds[0].axis
    return [K.rows(batch if axis > batch else batch + 1)]
  sums = view.of("sum")
  if (rank == 1 and len(sums) == 1 and len(view.of("uniform")) ==
      len(view.kinds) - 1 and view.inputs[sums[0]].dtype.is_integer):
    return [K.shape_of(sums[0], view.kinds[sums[0]].ragged)]
  if view.of("rows"):
    return K.GLOBALLY
  stats = {k for k in view.kinds if k.is_statistic}
  if len(stats) > 1:
    stats = {k.plain for k in stats}
  if len(stats) == 1 and all(k.is_statistic for k in view.kinds):
    return [stats.pop()]
  return K.LOCALLY


def concat(view: OpView):
  """Joined along another axis than the batch; a shape from shapes."""
  values, rank = view.kinds[:-1], view.out_rank()
  axes = view.axes(len(view.inputs) - 1, rank)
  if axes is None or not view.kinds[-1].is_uniform:
    return K.GLOBALLY
  if all(k.is_rows for k in values) and len(set(values)) == 1:
    return K.GLOBALLY if values[0].axis == axes[0] else [values[0]]
  values = [_as_shape(view.inputs[i], k) for i, k in enumerate(values)]
  shapes = [i for i, k in enumerate(values) if k.is_shape]
  if rank == 1 and len(shapes) == 1 and all(
      k.is_uniform or k.is_shape for k in values):
    before = [view.inputs[i].shape[0] for i in range(shapes[0])]
    if all(d is not None for d in before):
      kind = values[shapes[0]]
      return [K.shape_of(sum(before) + kind.axis, kind.ragged)]
  if any(k.is_rows for k in values):
    return K.GLOBALLY
  stats = set(values) if len(set(values)) == 1 else {k.plain for k in values}
  return [stats.pop()] if len(stats) == 1 and values[0].is_statistic else (
      K.LOCALLY)


def _as_shape(tensor, kind):
  """A one-entry integer count vector (`[batch_size]`) is a shape entry."""
  if (kind.plain == K.SUM and tensor.dtype.is_integer and
      tensor.shape.as_list() == [1]):
    return K.shape_of(0, kind.ragged)
  return kind


def unpack(view: OpView):
  """Unstacked along another axis than the batch; a shape's entries."""
  kind, rank = view.kinds[0], view.rank(0)
  axis = view.attr("axis", 0) % rank if rank else 0
  if kind.is_rows and axis != kind.axis:
    return [K.rows(kind.axis - (axis < kind.axis))] * view.num_outputs
  if kind.is_shape:
    return [K.count_of(kind) if i == kind.axis else K.UNIFORM
            for i in range(view.num_outputs)]
  if kind.is_statistic:
    return [kind] * view.num_outputs
  return K.GLOBALLY


def split(view: OpView):
  """`tf.split` along another axis than the batch."""
  value, axis_input = (1, 0) if view.type == "Split" else (0, 2)
  kind = view.kinds[value]
  axes = view.axes(axis_input, view.rank(value))
  others = [k for i, k in enumerate(view.kinds) if i != value]
  if not all(k.is_uniform for k in others) or axes is None:
    return K.GLOBALLY
  if kind.is_rows and axes[0] != kind.axis:
    return [kind] * view.num_outputs
  return [kind] * view.num_outputs if kind.is_statistic else K.GLOBALLY


def transpose(view: OpView):
  kind, perm = view.kinds[0], view.const(1)
  if kind.is_statistic:
    return [kind]
  if kind.is_rows and perm is not None and view.kinds[1].is_uniform:
    return [K.rows(list(perm).index(kind.axis))]
  return K.GLOBALLY


def expand_dims(view: OpView):
  kind = view.kinds[0]
  if kind.plain == K.SUM and view.inputs[0].dtype.is_integer and (
      view.rank(0) == 0):
    return [K.shape_of(0, kind.ragged)]  # [batch_size]
  if kind.is_statistic:
    return [kind]
  rank = view.out_rank()
  axis = view.const(1)
  if not kind.is_rows or axis is None or rank is None:
    return K.GLOBALLY if kind.is_rows else K.LOCALLY
  axis = int(axis) % rank
  return [K.rows(kind.axis + 1 if axis <= kind.axis else kind.axis)]


def squeeze(view: OpView):
  kind = view.kinds[0]
  if kind.is_statistic:
    return [kind]
  if not kind.is_rows or view.rank(0) is None:
    return K.GLOBALLY
  dims = [d % view.rank(0) for d in view.attr("squeeze_dims", [])]
  if not dims:
    shape = view.inputs[0].shape
    dims = [i for i in range(shape.rank) if i != kind.axis and shape[i] == 1]
  if kind.axis in dims:
    return K.GLOBALLY
  return [K.rows(kind.axis - sum(d < kind.axis for d in dims))]


def _packed_entry(arg, axis: int):
  """Entry `axis` of a `Pack`ed argument whose other entries the graph may
  not fix (`tf.tile(x, [1, 1, tf.shape(y)[2]])`), or None."""
  if arg.op.type != "Pack" or axis >= len(arg.op.inputs):
    return None
  entry = static_value(arg.op.inputs[axis])
  return None if entry is None else np.atleast_1d(entry)


def pad_or_tile(view: OpView):
  """Padding or tiling another axis than the batch's; a uniform tile to the
  shard's rows."""
  kind, arg = view.kinds[:2]
  value = view.const(1)
  if kind.is_rows and all(k.is_uniform for k in view.kinds[1:]) and (
      value is not None or _packed_entry(view.inputs[1], kind.axis) is not None):
    row = (_packed_entry(view.inputs[1], kind.axis) if value is None else
           np.atleast_1d(value[kind.axis]) if len(value) > kind.axis else None)
    keeps = (row is not None and
             (list(row) == [0, 0] if view.type != "Tile" else list(row) ==
              [1]))
    return [kind] if keeps else K.GLOBALLY
  if (view.type in ("Tile", "BroadcastTo") and kind.is_uniform and
      arg.is_shape and view.inputs[0].shape.rank is not None):
    rank, axis = view.out_rank(), arg.axis
    position = axis - (rank - view.inputs[0].shape.rank)
    if position < 0 or view.inputs[0].shape[position] == 1:
      return [K.LOCAL if arg.ragged else K.rows(axis)]
  if view.type == "BroadcastTo" and kind.is_rows and arg.is_shape:
    return [kind] if arg.axis == kind.axis + view.out_rank() - (
        view.rank(0) or 0) else K.GLOBALLY
  return K.LOCALLY if (arg.is_statistic or arg.is_shape) else K.GLOBALLY


def one_hot(view: OpView):
  kind = view.kinds[0]
  if not kind.is_rows or not all(k.is_uniform for k in view.kinds[1:]):
    return K.GLOBALLY
  axis = view.attr("axis", -1)
  return [K.rows(kind.axis if axis == -1 or axis > kind.axis
                 else kind.axis + 1)]


def gather(view: OpView):
  """Embedding lookups (uniform params, per-example ids), gathers along
  another axis of the rows, batched gathers, and rows picked by a
  `tf.where` of the shard (`tf.boolean_mask`)."""
  params, indices = view.kinds[:2]
  if params.is_shape and indices.is_uniform:
    return _entries_of_shape(params, view.const(1))
  if view.type == "ResourceGather":
    params = K.UNIFORM
  batch_dims = view.attr("batch_dims", 0)
  axis = view.const(2) if view.type == "GatherV2" else np.array(batch_dims)
  rank = view.rank(0) if view.type != "ResourceGather" else None
  if axis is None or (len(view.kinds) > 2 and not view.kinds[2].is_uniform):
    return K.GLOBALLY
  axis = int(axis) % rank if rank else int(axis)
  if params.is_uniform and indices.is_rows and not batch_dims:
    return [K.rows(axis + indices.axis)]
  if params.is_rows and indices.is_uniform and params.axis != axis and (
      not batch_dims):
    index_rank = view.rank(1)
    if index_rank is None:
      return K.GLOBALLY
    return [K.rows(params.axis if params.axis < axis else
                   params.axis + index_rank - 1)]
  if params == indices == K.rows(0) and batch_dims:
    return [K.rows(0)]
  return K.GLOBALLY


def _entries_of_shape(kind, picked):
  """Entries `picked` of a shape vector: the shard's size where they take
  its batch entry."""
  if picked is None:
    return K.LOCALLY
  picked = np.asarray(picked)
  if picked.ndim == 0:
    return [K.count_of(kind) if int(picked) == kind.axis else K.UNIFORM]
  hits = [i for i, p in enumerate(picked.tolist()) if p == kind.axis]
  if len(hits) > 1:
    return K.LOCALLY
  return [K.shape_of(hits[0], kind.ragged) if hits else K.UNIFORM]


def gather_nd(view: OpView):
  params, indices = view.kinds[:2]
  if params.is_uniform and indices.is_rows and (
      view.rank(1) is not None and indices.axis < view.rank(1) - 1):
    return [K.rows(indices.axis)]
  return K.GLOBALLY


def where(view: OpView):
  """`tf.where(mask)` of the shard: rows counted by their values."""
  if view.kinds[0] == K.rows(0):
    return [K.LOCAL]
  return K.GLOBALLY


def tensor_list(view: OpView):
  """TensorList and TensorArray ops of the shard (`tf.while_loop`,
  `dynamic_rnn`, `tf.map_fn`): kept per shard, as written."""
  return [K.LOCAL] * view.num_outputs


LIST_PREFIXES = ("TensorList", "TensorArray")

RULES = {
    "Shape": shape, "ShapeN": shape, "Size": shape, "Rank": shape,
    "StridedSlice": strided_slice, "Slice": slice_op, "Reshape": reshape,
    "Fill": fill, "Pack": pack, "ConcatV2": concat, "Unpack": unpack,
    "Split": split, "SplitV": split, "Transpose": transpose,
    "ExpandDims": expand_dims, "Squeeze": squeeze, "Pad": pad_or_tile,
    "PadV2": pad_or_tile, "MirrorPad": pad_or_tile, "Tile": pad_or_tile,
    "BroadcastTo": pad_or_tile, "OneHot": one_hot, "GatherV2": gather,
    "ResourceGather": gather, "GatherNd": gather_nd, "Where": where,
}
