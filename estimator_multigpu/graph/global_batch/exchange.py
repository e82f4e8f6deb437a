"""What a tower's op needs of the other towers, built inside the tower.

Every function here is differentiable where its input can carry a
gradient, uneven-safe and empty-shard-safe, and issues the same collectives
in every tower (the keys follow the call order):

- `gather(x, axis)`: every tower's rows of `x` along `axis`, in input
  order, with this tower's (offset, rows) for slicing results back;
- `global_statistic(x, kind, share)`: a `SUM` as Σᵢ xᵢ, a `MEAN` as
  Σᵢ (nᵢ/n)·xᵢ (an empty shard's NaN weighted by 0, not added);
- `global_shape(v, axis)`: a shape vector with the shard's row count
  replaced by the global batch's;
- `combined(x, op_type)`: a reduction over the batch axis (max, min, prod,
  all, any) of the towers' reductions;
- `rows_back(y, axis, offset, rows)`: this tower's rows of a global result.
"""

from __future__ import annotations

import tensorflow as tf

from estimator_multigpu.cross_tower import context as context_lib
from estimator_multigpu.cross_tower import losses

_REDUCE = {"Max": tf.reduce_max, "Min": tf.reduce_min,
           "Prod": tf.reduce_prod, "All": tf.reduce_all,
           "Any": tf.reduce_any, "Sum": tf.reduce_sum}


def _context() -> context_lib.TowerContext:
  return context_lib.current()


def gather(x: tf.Tensor, axis: int) -> tuple:
  """(every tower's `x` along `axis`, this tower's offset, its rows)."""
  if axis:
    perm = [axis] + [i for i in range(x.shape.rank) if i != axis]
    x = tf.transpose(x, perm)
  rows = tf.shape(x)[0]
  offset, _ = losses.row_offsets(rows, _context())
  joined = _concat(x)
  if axis:
    inverse = [perm.index(i) for i in range(len(perm))]
    joined = tf.transpose(joined, inverse)
  joined.set_shape(_rows_unknown(x.shape if not axis else tf.TensorShape(
      [x.shape[i] for i in inverse]), axis))
  return joined, offset, rows


def _concat(x: tf.Tensor) -> tf.Tensor:
  """All-gather along axis 0; other axes of sizes unknown to the graph go
  through as one flat axis (a collective keeps the shape it first ran with
  unless only its rows vary: `collectives._key_for_rows`)."""
  if x.shape.rank is None or x.shape.rank > 1 and (
      not x.shape[1:].is_fully_defined()):  # (a tf.cond's of unknown rank)
    inner = tf.shape(x)[1:]
    flat = _concat(tf.reshape(x, [-1]))
    return tf.reshape(flat, tf.concat([[-1], inner], 0))
  if x.dtype == tf.string:
    raise TypeError(
        f"multi_gpu cannot gather the string tensor {x.name} across the "
        "towers to compute an op on the global batch. Compute on numbers "
        "inside the model_fn (ids), or turn them into strings after it.")
  if x.dtype.is_floating:
    return losses.cross_tower_concat(x)
  joined = losses.cross_tower_concat(tf.cast(x, tf.float64))
  return tf.cast(tf.round(joined) if x.dtype != tf.bool else joined, x.dtype)


def global_statistic(x: tf.Tensor, kind_name: str, share) -> tf.Tensor:
  """The global batch's value of a shard statistic."""
  dtype = x.dtype
  value = x if dtype.is_floating else tf.cast(x, tf.float64)
  if kind_name == "mean":
    value = tf.math.multiply_no_nan(value, tf.cast(share, value.dtype))
  total = losses.cross_tower_sum(value)
  return total if dtype.is_floating else tf.cast(tf.round(total), dtype)


def global_shape(vector: tf.Tensor, axis: int) -> tf.Tensor:
  """`vector` (a shape) with entry `axis` summed over the towers."""
  entry = tf.cast(vector[axis], tf.float64)
  total = tf.cast(losses.cross_tower_sum(tf.stop_gradient(entry)),
                  vector.dtype)
  mask = tf.one_hot(axis, tf.size(vector), dtype=vector.dtype)
  return vector + mask * (total - vector[axis])


def combined(x: tf.Tensor, op_type: str) -> tf.Tensor:
  """The towers' per-shard reductions `x` combined by the same reduction."""
  context = _context()
  dtype = x.dtype
  value = x if dtype.is_floating else tf.cast(x, tf.float64)
  towers, index = context.group.num_towers, context.tower_index
  stacked = tf.pad(value[None], [[index, towers - 1 - index]] +
                   [[0, 0]] * value.shape.rank)
  joined = losses.cross_tower_sum(stacked)
  if dtype == tf.bool:
    joined = tf.cast(joined, tf.bool)
  result = _REDUCE[op_type](joined, axis=0)
  return tf.cast(result, dtype) if result.dtype != dtype else result


def rows_back(y: tf.Tensor, axis: int, offset, rows) -> tf.Tensor:
  """This tower's `rows` rows of `y` along `axis`, from `offset`."""
  rank = y.shape.rank if y.shape.rank is not None else tf.rank(y)
  begin = tf.one_hot(axis, rank, dtype=tf.int32) * tf.cast(offset, tf.int32)
  size = tf.tensor_scatter_nd_update(-tf.ones([rank], tf.int32), [[axis]],
                                     [tf.cast(rows, tf.int32)])
  back = tf.slice(y, begin, size)
  back.set_shape(_rows_unknown(y.shape, axis))
  return back


def _rows_unknown(shape: tf.TensorShape, axis: int) -> tf.TensorShape:
  """`shape` with its batch axis of any size (the other axes kept, so
  what reads the rows builds as on one device)."""
  if shape.rank is None:
    return shape
  dims = shape.as_list()
  dims[axis] = None
  return tf.TensorShape(dims)
