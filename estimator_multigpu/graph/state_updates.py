"""State the model_fn updates in its own train_op, outside UPDATE_OPS.

Each step runs tower 0's train_op only, so a variable written there (an
example counter, center-loss centers, a hand-written batch norm's moving
averages) would see tower 0's shard only. `reconcile` reads the graph's
structure (op types and data flow, never names) of every variable write the
train_op reaches outside UPDATE_OPS and whose value depends on the shard:

- its value depends on the shard only through a cross-tower tool
  (`cross_tower_sum`, `cross_tower_moments`, ...): it is already the global
  batch's; tower 0 writes it once, and the train_op also runs the tool's collective in
  towers 1.. (without them it would wait for its peers until the timeout);
- an `assign_add`/`assign_sub`/`scatter_add`/`scatter_sub` whose value does
  not read the variable (a counter, a sum over the batch): every tower adds
  its own shard's part, so the variable moves by the global batch's sum;
- anything else (a moving average, center loss reading its centers): a
  WARNING naming the variable and the cross-tower tool that makes it exact.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Iterable, Optional

from absl import logging
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

_ADDITIVE = {"AssignAddVariableOp": 1, "AssignSubVariableOp": 1,
             "AssignAdd": 1, "AssignSub": 1, "ResourceScatterAdd": 2,
             "ResourceScatterSub": 2, "ScatterAdd": 2, "ScatterSub": 2}
_OTHER_WRITES = {"AssignVariableOp": 1, "Assign": 1,
                 "ResourceScatterUpdate": 2, "ScatterUpdate": 2,
                 "ResourceScatterMul": 2, "ResourceScatterDiv": 2,
                 "ResourceScatterMin": 2, "ResourceScatterMax": 2,
                 "ScatterMul": 2, "ScatterDiv": 2, "ScatterNdUpdate": 2,
                 "ResourceScatterNdUpdate": 2, "ScatterNdAdd": 2,
                 "ResourceScatterNdAdd": 2}
_WRITES = {**_ADDITIVE, **_OTHER_WRITES}
_VARIABLE_OPS = frozenset(["VarHandleOp", "VariableV2", "Variable"])


def reconcile(towers: list, shard: Iterable) -> list:
  """The ops tower 0's train_op must also run; warns for inexact writes.

  Args:
    towers: the built towers (before the update is tied to them).
    shard: tower 0's inputs (a nested structure of tensors).

  Returns:
    Towers 1..'s matching additive writes and collectives.
  """
  tower0 = towers[0]
  update_ops = {_op(t) for t in tower0.collections.get(
      tf1.GraphKeys.UPDATE_OPS, [])}
  reached = ancestors([_op(tower0.spec.train_op)], stop=update_ops)
  tensors = [t for t in tf.nest.flatten(shard, expand_composites=True)
             if isinstance(t, tf.Tensor)]
  shard = _Shard({t.op for t in tensors}, _static_shapes(tensors))
  extra = peer_collectives(reached)
  skip = update_ops | {_op(_variable_of(tf1.train.get_global_step()))}
  for op in sorted(reached, key=lambda o: o.name):
    if op.type in _WRITES and _variable(op) not in skip and op not in skip:
      extra += _reconcile_write(op, towers, shard)
  return extra


@dataclasses.dataclass(frozen=True)
class _Shard:
  ops: set  # the ops of tower 0's inputs.
  shapes: list  # their static shapes (fully known ones), as lists.


def _static_shapes(tensors: list) -> list:
  return [t.shape.as_list() for t in tensors
          if t.shape.rank and t.shape.is_fully_defined()]


def _variable_of(variable):
  return variable.op if variable is not None else None


def _depends_on_shard(value: set, peer_values: list, shard: _Shard) -> bool:
  """Whether the written value depends on the tower's shard: through its
  inputs, or through its static shape (`tf.shape` of a static shard is a
  constant): constants that differ between towers, or a shard's shape."""
  if value & shard.ops:
    return True
  constants = [_constants(ops) for ops in [value] + peer_values]
  if any(len(c) != len(constants[0]) or any(
      not np.array_equal(a, b) for a, b in zip(c, constants[0]))
         for c in constants[1:]):
    return True
  return any(np.array_equal(c, shape) for c in constants[0]
             for shape in shard.shapes)


def _constants(ops: set) -> list:
  return [tf.make_ndarray(op.get_attr("value"))
          for op in sorted(ops, key=lambda o: o.name) if op.type == "Const"]


def _reconcile_write(op, towers: list, shard: _Shard) -> list:
  """Towers 1..'s copies of an additive write, or [] (and maybe a warning)."""
  value = ancestors(_value_ops(op), stop=is_collective)
  peers = [_peer(op, tower) for tower in towers[1:]]
  peer_values = [ancestors(_value_ops(p), stop=is_collective)
                 for p in peers if p]
  if not _depends_on_shard(value, peer_values, shard):
    return []  # the same in every tower, or already the global batch's.
  variable = _variable(op)
  if op.type in _ADDITIVE and variable not in value:
    if all(peers):
      logging.info("multi_gpu: `%s` is updated in the train_op (%s): every "
                   "tower adds its shard's part.", variable.name, op.type)
      return peers
  _warn(variable, op)
  return []


# Variables the train_op updates from tower 0's shard only (`check_towers`).
STATE_COLLECTION = "estimator_multigpu_train_op_state_updates"


def _warn(variable, op) -> None:
  tf1.add_to_collection(STATE_COLLECTION, variable.name)
  logging.warning(
      "multi_gpu: the train_op updates `%s` (%s) from tower 0's shard only: "
      "the value written depends on the tower's batch and is not one of the "
      "global batch. Compute it over the global batch with "
      "`emg.cross_tower_sum` (e.g. center loss: the per-class counts and "
      "sums) or `emg.cross_tower_moments` (batch-norm moving averages; or "
      "use tf.compat.v1.layers.BatchNormalization with "
      "multi_gpu(sync_batch_norm=True)), or put the update in UPDATE_OPS.",
      variable.name, op.type)


def peer_collectives(reached: set) -> list:
  """Towers 1..'s collectives matching those tower 0's train_op runs (by
  instance key): a collective waits for every tower of its group."""
  keys = {_instance_key(op) for op in reached if is_collective(op)} - {None}
  if not keys:
    return []
  graph = next(iter(reached)).graph
  return [op for op in graph.get_operations()
          if is_collective(op) and op not in reached
          and _instance_key(op) in keys]


def _instance_key(op):
  names = [arg.name for arg in op.op_def.input_arg]
  if "instance_key" in names:
    key = tf.get_static_value(op.inputs[names.index("instance_key")])
    return None if key is None else int(key)
  return op.get_attr("instance_key") if "instance_key" in op.node_def.attr \
      else None


def _peer(op, tower):
  """Tower `tower`'s op built by the same line of the model_fn, or None."""
  try:
    return op.graph.get_operation_by_name(f"{tower.name}/{op.name}")
  except KeyError:
    return None


def _value_ops(op) -> list:
  """The tensors a write op writes (indices, values)."""
  return list(op.inputs[_written_value_index(op):])


def _written_value_index(op) -> int:
  return _WRITES[op.type]


def _variable(op):
  """The variable op a write op writes (through identities)."""
  source = op.inputs[0].op
  while source.type not in _VARIABLE_OPS and source.inputs:
    source = source.inputs[0].op
  return source


def is_collective(op) -> bool:
  return op.type.startswith("Collective")


def ancestors(ops: list, stop=frozenset()) -> set:
  """`ops` (ops or tensors) and every op they depend on (data and control inputs), not
  expanding the `stop` ops (a set, or a predicate). Through an `IdentityN`
  (`tf.custom_gradient`'s) only the input of the output used is followed."""
  stops = stop if callable(stop) else stop.__contains__
  seen_ops, seen = set(), set()
  queue = collections.deque(
      (item, None) if isinstance(item, tf.Operation)
      else (item.op, item.value_index) for item in ops)
  while queue:
    op, index = queue.popleft()
    if (op, index) in seen:
      continue
    seen.add((op, index))
    seen_ops.add(op)
    if stops(op):
      continue
    queue.extend(_parents(op, index))
  return seen_ops


def _parents(op, index) -> list:
  """(op, output index or None) of what `op`'s output `index` reads."""
  if op.type == "IdentityN" and index is not None:
    return [(op.inputs[index].op, op.inputs[index].value_index)]
  return ([(t.op, t.value_index) for t in op.inputs] +
          [(c, None) for c in op.control_inputs])


def _op(item):
  return item if isinstance(item, tf.Operation) else item.op
