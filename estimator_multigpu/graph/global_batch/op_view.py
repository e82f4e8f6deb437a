"""One op as the table reads it: its type, inputs, their kinds, attributes."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from estimator_multigpu import compat

tensor_util = compat.internal("tensor_util")


class OpView:
  """The op being classified.

  Args:
    op: the op TensorFlow built (its attributes and static output shapes).
    inputs: its inputs.
    kinds: each input's `kinds.Kind`.
  """

  def __init__(self, op, inputs, kinds):
    self.op = op
    self.type = op.type
    self.inputs = list(inputs)
    self.kinds = list(kinds)

  @property
  def num_outputs(self) -> int:
    return len(self.op.outputs)

  def attr(self, name: str, default: Any = None) -> Any:
    try:
      return self.op.get_attr(name)
    except ValueError:
      return default

  def const(self, index: int) -> Optional[np.ndarray]:
    """Input `index`'s value when it is known while the graph is built."""
    if index >= len(self.inputs):
      return None
    return static_value(self.inputs[index])

  def rank(self, index: int) -> Optional[int]:
    return self.inputs[index].shape.rank

  def out_rank(self, index: int = 0) -> Optional[int]:
    return self.op.outputs[index].shape.rank

  def axes(self, index: int, rank: Optional[int]) -> Optional[list]:
    """Input `index` as a list of axes normalized by `rank`, or None."""
    value = self.const(index)
    if value is None or rank is None:
      return None
    return sorted({int(a) % rank if rank else 0 for a in
                   np.atleast_1d(value)})

  def of(self, name: str) -> list:
    """The positions of the inputs of kind `name`."""
    return [i for i, k in enumerate(self.kinds) if k.name == name]

  def all_of(self, *names: str) -> bool:
    return all(k.name in names for k in self.kinds)

  def static_dims(self, index: int, start: int = 0) -> Optional[list]:
    shape = self.inputs[index].shape
    if shape.rank is None or not shape[start:].is_fully_defined():
      return None
    return shape.as_list()[start:]

  def out_static_dims(self, start: int = 0, index: int = 0) -> Optional[list]:
    shape = self.op.outputs[index].shape
    if shape.rank is None or not shape[start:].is_fully_defined():
      return None
    return shape.as_list()[start:]


_ARITHMETIC = {"Sub": np.subtract, "AddV2": np.add, "Add": np.add,
               "Mul": np.multiply, "Maximum": np.maximum,
               "Minimum": np.minimum}


def static_value(tensor, depth: int = 4) -> Optional[np.ndarray]:
  """`tensor`'s value if the graph fixes it: a constant, or a little
  arithmetic of constants (`rank(x) - 1` as an axis), stacked or joined
  (`tf.concat([-1 * tf.ones_like(shape[:-1]), [k]], 0)` as a slice's size,
  `tf.estimator.MultiHead`'s)."""
  value = tensor_util.constant_value(tensor)
  if value is not None or depth == 0:
    return value
  op = tensor.op
  if op.type in ("Pack", "ConcatV2"):
    values = [static_value(t, depth - 1) for t in op.inputs]
    if any(v is None for v in values):
      return None
    if op.type == "ConcatV2":
      return np.concatenate(values[:-1], axis=int(values[-1]))
    return np.stack(values, axis=op.get_attr("axis"))
  if op.type == "Neg":
    inner = static_value(op.inputs[0], depth - 1)
    return None if inner is None else np.negative(inner)
  if op.type not in _ARITHMETIC:
    return None
  values = [static_value(t, depth - 1) for t in op.inputs]
  if any(v is None for v in values):
    return None
  return _ARITHMETIC[op.type](*values).astype(tensor.dtype.as_numpy_dtype)


def leads_with_minus_one(tensor) -> bool:
  """Whether a shape argument is [-1, ...] (a `Pack` or a join)."""
  op = tensor.op
  first = None
  if op.type == "Pack" and op.inputs:
    first = static_value(op.inputs[0])
  elif op.type == "ConcatV2" and len(op.inputs) > 1:
    head = static_value(op.inputs[0])
    first = head[:1] if head is not None and np.size(head) else None
  else:
    value = static_value(tensor)
    first = value[:1] if value is not None and np.size(value) else None
  return first is not None and int(np.ravel(first)[0]) == -1

