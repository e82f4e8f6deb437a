"""Which ops write a variable, read from what they do (never their names).

An op writes a variable when it takes the variable's handle (resource
variables) or reference (ref variables) and is a stateful op that does more
than read it: `assign*`, `scatter_*`, `resource_scatter_*`, optimizer
applies, a Keras layer's `add_update`, whatever the op type. A function call
(`tf.cond`'s `If`, `tf.while_loop`'s `While`, a `tf.function`) that passes
a handle to a write in its body writes it too. Reading ops (`ReadVariableOp`,
`ResourceGather`, ...) are the only ones listed by type.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import tensorflow as tf

from estimator_multigpu.graph import dataflow


@dataclasses.dataclass(frozen=True)
class Write:
  """One op of the graph that writes a variable.

  Attributes:
    op: the op (a write, or the function call whose body writes).
    variable: the variable op written.
    kind: the writing op's type ("If > ResourceScatterSub" in a body).
    values: the op's other inputs (what it writes, its indices).
  """
  op: tf.Operation
  variable: tf.Operation
  kind: str
  values: tuple

  @property
  def in_function(self) -> bool:
    return " > " in self.kind

  @property
  def additive(self) -> bool:
    return self.kind in dataflow.ADDITIVE_WRITES


def writes_of(op: tf.Operation) -> list:
  """The variables `op` writes (none for a read or any other op)."""
  if op.type in dataflow.VARIABLE_USES_NOT_WRITING:
    return []
  handles = _written_inputs(op)
  found = []
  for k in handles:
    variable = variable_of(op.inputs[k])
    if variable is None:
      continue
    kind = _kind(op, k)
    if kind:
      values = tuple(t for i, t in enumerate(op.inputs) if i not in handles)
      found.append(Write(op, variable, kind, values))
  return found


def variable_of(tensor: tf.Tensor) -> Optional[tf.Operation]:
  """The variable op a handle or reference comes from (through identities),
  or None."""
  op = tensor.op
  while op.type not in dataflow.VARIABLES:
    if op.type not in dataflow.IDENTITIES or not op.inputs:
      return None
    index = tensor.value_index if op.type == "IdentityN" else 0
    tensor = op.inputs[index]
    op = tensor.op
  return op


def _written_inputs(op: tf.Operation) -> list:
  """Indices of the inputs that may be written: handles into a stateful op,
  references into a ref argument."""
  stateful = op.op_def.is_stateful
  refs = _ref_arguments(op)
  return [k for k, t in enumerate(op.inputs)
          if (t.dtype == tf.resource and stateful) or k in refs]


def _ref_arguments(op: tf.Operation) -> set:
  args = op.op_def.input_arg
  if any(a.number_attr or a.type_list_attr for a in args):
    return set()
  return {k for k, a in enumerate(args) if a.is_ref}


def _kind(op: tf.Operation, index: int) -> str:
  """The type of the op that writes input `index` ('' if nothing does)."""
  bodies = dataflow.function_bodies(op)
  if not bodies:
    return op.type
  for body in bodies:
    offset = len(op.inputs) - len(body.inputs)
    if 0 <= index - offset < len(body.inputs):
      inner = _body_write(body, body.inputs[index - offset])
      if inner:
        return f"{op.type} > {inner}"
  return ""


def _body_write(body, handle: tf.Tensor) -> str:
  """The type of an op of `body` writing through `handle`, or ''."""
  for op in body.get_operations():
    for k, t in enumerate(op.inputs):
      if t is handle and op.type not in dataflow.VARIABLE_USES_NOT_WRITING:
        kind = _kind(op, k) if k in _written_inputs(op) else ""
        if kind:
          return kind
  return ""
