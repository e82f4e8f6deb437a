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
    return tensor_util.constant_value(self.inputs[index])

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
