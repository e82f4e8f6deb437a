"""Which outputs of an op on the global batch are per example, and on which
axis: the op built once more in a scratch graph, its examples' axes given a
size no other axis has (`PROBE_ROWS`), its constant inputs kept; an output
axis of that size holds one row per example of the global batch."""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from estimator_multigpu import compat

tensor_util = compat.internal("tensor_util")
tf1 = tf.compat.v1
PROBE_ROWS = 9973


def aligned_axes(op: tf.Operation, inputs: list, kinds: list) -> list:
  """Per output of `op`, the axis of the global batch's examples, or None."""
  if any(attr.func.name or attr.list.func
         for attr in op.node_def.attr.values()):
    return [None] * len(op.outputs)
  try:
    with tf.Graph().as_default() as scratch:
      stand_ins = [_stand_in(t, k) for t, k in zip(inputs, kinds)]
      built = compat.private(scratch, "_create_op_internal")(
          op.type, stand_ins, dtypes=[o.dtype for o in op.outputs],
          attrs=dict(op.node_def.attr))
      return [_axis_of(o.shape) for o in built.outputs]
  except (ValueError, TypeError, tf.errors.OpError):
    return [None] * len(op.outputs)


def _axis_of(shape: tf.TensorShape) -> Optional[int]:
  if shape.rank is None:
    return None
  dims = shape.as_list()
  return dims.index(PROBE_ROWS) if PROBE_ROWS in dims else None


def _stand_in(tensor: tf.Tensor, kind) -> tf.Tensor:
  """A placeholder shaped like `tensor` with its batch axis PROBE_ROWS long,
  or its value where it is known."""
  if kind.is_rows and tensor.shape.rank is not None:
    dims = tensor.shape.as_list()
    dims[kind.axis] = PROBE_ROWS
    return tf1.placeholder(tensor.dtype, dims)
  value = None
  if kind.is_shape:
    value = _probe_shape(tensor, kind.axis)
  elif kind.is_uniform:
    value = tensor_util.constant_value(tensor)
  if value is not None:
    return tf.constant(value, dtype=tensor.dtype)
  return tf1.placeholder(tensor.dtype, tensor.shape)


def _probe_shape(tensor: tf.Tensor, axis: int):
  dims = tensor_util.constant_value_as_shape(tensor)
  if dims.rank is None:
    return None
  dims = dims.as_list()
  if tensor.op.type == "Pack" and len(tensor.op.inputs) == len(dims):
    dims = [d if d is not None else _dim_of(t)
            for d, t in zip(dims, tensor.op.inputs)]
  dims[axis] = PROBE_ROWS
  if any(d is None for d in dims):
    return None
  return np.array(dims, dtype=tensor.dtype.as_numpy_dtype)


def _dim_of(entry: tf.Tensor):
  """A static axis size an entry of a shape reads: `tf.unstack(tf.shape(x))`'s
  or `tf.shape(x)[i]`'s, where x's axis i is known; else None."""
  op, index = entry.op, entry.value_index
  if op.type == "StridedSlice" and op.inputs[0].op.type == "Shape":
    begin = tensor_util.constant_value(op.inputs[1])
    index = int(begin[0]) if begin is not None and begin.size == 1 else None
    op = op.inputs[0].op
  elif op.type == "Unpack" and op.inputs[0].op.type == "Shape":
    op = op.inputs[0].op
  else:
    return None
  shape = op.inputs[0].shape
  if index is None or shape.rank is None or not -shape.rank <= index < shape.rank:
    return None
  return shape[index]
