"""State the model_fn writes itself, outside UPDATE_OPS and the optimizer.

Each step runs tower 0's train_op (and tower 0's hooks) only, so a variable
written there (an example counter, a class histogram, center-loss centers, a
hand-written batch norm's moving averages) would see tower 0's shard only.
`reconcile` finds every write of tower 0 by what the op does (`writes`:
any op taking a variable's handle or reference to change it) that runs with
the step — grouped into the train_op, a control dependency of `minimize`,
inside a `tf.cond`, or in an op a hook runs (any write tower 0 built) — and
reads the graph's structure (data flow, never names) of the value written:

- its value depends on the shard only through a cross-tower tool
  (`cross_tower_sum`, `cross_tower_moments`, ...): it is already the global
  batch's; tower 0 writes it once, and the train_op also runs the tool's
  collective in towers 1.. (without them it would wait for its peers until
  the timeout);
- an additive write (`assign_add`, `scatter_add`, `scatter_nd_sub`, ...)
  whose value does not read the variable (a counter, a sum over the
  examples): tower 0's write runs every tower's (control inputs), so the
  variable moves by the global batch's sum, whichever op runs it;
- a write to a replicated variable's copies that the towers agree on (a
  max-norm constraint): every tower's runs, on its own copy;
- a write whose value reads the shard only through a batch-norm layer's
  statistics of it (the layer's moving averages outside UPDATE_OPS, e.g. a
  Keras model's `updates` grouped into the train_op without
  `sync_batch_norm`): the layer's own WARNING says it, once
  (`mark_batch_norm_statistics`); a write of what the layer outputs is not;
- anything else (a moving average, center loss reading its centers, a write
  inside a `tf.cond`): a WARNING naming the variables, the ops, how they run
  and the cross-tower tool that makes them exact: one line per model and
  mode, however many variables share the cause.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional
import weakref

from absl import logging
import numpy as np
import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu.graph import dataflow
from estimator_multigpu.graph import runnable
from estimator_multigpu.graph import shard_statistics
from estimator_multigpu.graph import tensor_kinds
from estimator_multigpu.graph import warn_once
from estimator_multigpu.graph import writes as writes_lib
from estimator_multigpu.graph.global_batch import scopes as global_batch

tf1 = tf.compat.v1


def reconcile(towers: list, shard: Iterable,
              tower_ops: Optional[dict] = None) -> list:
  """Makes tower 0's writes one device's, or warns; returns what tower 0's
  train_op must also run (towers 1..'s matching collectives).

  Args:
    towers: the built towers (before the update is tied to them).
    shard: tower 0's inputs (a nested structure of tensors).
    tower_ops: {tower index: the ops it built}: tower 0's writes outside
      the train_op (a hook may run them), and towers matched by position
      among the ops of each type (else by name).
  """
  tower0 = towers[0]
  if not tower0.optimizer_calls:  # unwrapped: an error, not these writes.
    return []
  batch_norms = list(_BATCH_NORM_STATISTICS.get(tf1.get_default_graph(),
                                                {}).values())
  update_ops = {_op(t) for t in tower0.collections.get(
      tf1.GraphKeys.UPDATE_OPS, [])}
  reached = _runs([_op(tower0.spec.train_op)], stop=update_ops)
  # The walk yields its stops: tower 0's UPDATE_OPS are multi_gpu's to run
  # once per step (their writes are not the model_fn's own).
  own = reached - update_ops
  updating = _runs(update_ops) if update_ops else set()
  tensors = [t for t in tf.nest.flatten(shard, expand_composites=True)
             if isinstance(t, tf.Tensor)]
  context = _Context(towers, _Shard({t.op for t in tensors},
                                    _static_shapes(tensors)), reached,
                     tower_ops or {}, tensor_kinds.shard_analysis(shard),
                     batch_norms)
  skip = _not_the_model_fns(tower0)
  outside = (set(context.tower_ops.get(0, ())) - updating - reached -
             _initializers())
  outside -= runnable.run_by_nothing(
      [op for op in outside if writes_lib.writes_of(op)], tower0.spec,
      tower0.collections)
  inexact = []
  for op in sorted(own | outside, key=lambda o: o.name):
    for write in writes_lib.writes_of(op):
      if write.variable not in skip:
        _run_with(op, _reconcile_write(write, context, inexact))
  _warn(inexact)
  return peer_collectives(reached)


# Per graph: batch-norm layers' statistics of their tower's shard, by ref.
_BATCH_NORM_STATISTICS: "weakref.WeakKeyDictionary" = (
    weakref.WeakKeyDictionary())


def mark_batch_norm_statistics(tensors) -> None:
  """Marks a batch-norm layer's mean and variance of its tower's shard
  (whose per-tower use the layer warned about): a write whose value reads
  the shard only through them is that warning's, not another."""
  for tensor in tf.nest.flatten(tensors):
    if isinstance(tensor, tf.Tensor):
      _BATCH_NORM_STATISTICS.setdefault(tensor.graph, {})[tensor.ref()] = (
          tensor)


@dataclasses.dataclass(frozen=True)
class _Shard:
  ops: set  # the ops of tower 0's inputs.
  shapes: list  # their static shapes (fully known ones), as lists.


@dataclasses.dataclass(frozen=True)
class _Context:
  towers: list
  shard: _Shard
  reached: set  # what tower 0's train_op runs.
  tower_ops: dict
  analysis: "tensor_kinds.ShardAnalysis"  # tower 0's tensors, by kind.
  batch_norms: list  # batch-norm layers' statistics of their shard.


def _not_the_model_fns(tower0) -> set:
  """Variables whose writes are not the model_fn's state: `global_step`
  and streaming-metric state."""
  step = tf1.train.get_global_step()
  metrics = tower0.collections.get(tf1.GraphKeys.METRIC_VARIABLES, []) + \
      tf1.get_collection(tf1.GraphKeys.METRIC_VARIABLES)
  return {writes_lib.variable_of(v.op.outputs[0]) or v.op
          for v in ([step] if step is not None else []) + metrics
          if hasattr(v, "op")}


def _initializers() -> set:
  """The variables' own initializers (they write the variable once, before
  any step: not the model_fn's state)."""
  variables = (tf1.global_variables() + tf1.local_variables() +
               tf1.get_collection(tf1.GraphKeys.METRIC_VARIABLES))
  return {v.initializer for v in variables
          if getattr(v, "initializer", None) is not None}


def _run_with(op, peers: list) -> None:
  """Tower 0's `op` runs `peers` first, whichever op of the step runs it."""
  if peers:
    compat.private(op, "_add_control_inputs")(peers)


def _static_shapes(tensors: list) -> list:
  return [t.shape.as_list() for t in tensors
          if t.shape.rank and t.shape.is_fully_defined()]


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


def _reconcile_write(write, context: _Context, inexact: list) -> list:
  """Towers 1..'s writes tower 0's must run (maybe none); appends to
  `inexact` (write, how it runs) when it stays tower 0's shard's."""
  peers = [_peer(write, tower, context) for tower in context.towers[1:]]
  value = _runs(write.values, stop=dataflow.is_collective)
  peer_values = [_runs(p.values, stop=dataflow.is_collective)
                 for p in peers if p]
  own_copies = all(peers) and any(p.variable is not write.variable
                                  for p in peers)
  # A function call's last input is any capture (a tf.cond's predicate,
  # global when the loss is), not the value its body writes.
  if not _depends_on_shard(value, peer_values, context.shard) or (
      global_batch.global_values(write.values)) or (
      not write.in_function and
      context.analysis.status(write.values[-1]) == tensor_kinds.GLOBAL):
    # The same in every tower, or already the global batch's.
    if not own_copies:
      return []
    _same_checkpoint(value, peer_values)
    return [p.op for p in peers]
  if (write.additive and write.variable not in value and all(peers)
      and not own_copies and _sums_examples(write, context.analysis)):
    logging.info("multi_gpu: `%s` is updated with the step (%s): every "
                 "tower adds its shard's part.", write.variable.name,
                 write.kind)
    return [p.op for p in peers]
  if not _batch_norms_own(write, value, context):
    inexact.append((write, _how(write, context)))
  return []


_RESTORES = frozenset({"RestoreV2", "Restore", "RestoreSlice"})


def _same_checkpoint(value: set, peer_values: list) -> None:
  """A checkpoint restore of tower 0's variable (`Saver.restore` in a
  Scaffold `init_fn`): the towers' restores of their copies read the file
  tower 0's reads, the one fed to tower 0's Saver (theirs, never fed, would
  read their Saver's default name)."""
  mine = [op for op in value if op.type in _RESTORES]
  if not mine:
    return
  prefix = mine[0].inputs[0]
  for op in {op for ops in peer_values for op in ops if op.type in _RESTORES}:
    if op.inputs[0] is not prefix:
      compat.private(op, "_update_input")(0, prefix)


def _batch_norms_own(write, value: set, context: _Context) -> bool:
  """Whether the write's `value` reads tower 0's shard only through
  batch-norm statistics (and shapes: a Bessel correction's count): a
  layer's moving average, which its one warning covers."""
  if not any(t.op in value for t in context.batch_norms):
    return False
  shapes = [t for op in value if op.type in dataflow.SHAPE_OPS
            for t in op.outputs]
  reads = _runs(write.values, stop=context.batch_norms + shapes)
  return not reads & context.shard.ops


def _sums_examples(write, analysis: tensor_kinds.ShardAnalysis) -> bool:
  """Whether what an additive write adds is a sum over the shard's examples
  (per-example rows scattered, a sum, a count): then the towers' writes add
  up to one device's. A mean, a max or a gradient of the shard is not."""
  written = write.values[-1]  # the value (a scatter's indices come first).
  status = analysis.status(written)
  if status == tensor_kinds.ROWS:
    return shard_statistics.whole_shard(written, analysis)
  if status != tensor_kinds.STATISTIC:  # a count TensorFlow folded, an integer.
    return True
  return (shard_statistics.statistic_kind(written, analysis) ==
          shard_statistics.SUM)


def _how(write, context: _Context) -> str:
  """How the write runs with the step, in the user's words."""
  if write.in_function:
    return "inside a tf.cond, tf.while_loop or tf.function"
  if write.op not in context.reached:
    return "outside the train_op: in an op a hook runs, or not run"
  recorded = {call.recorded for call in context.towers[0].optimizer_calls}
  consumers = [op for op in context.reached if write.op in op.control_inputs]
  if any(op in recorded or op.name.endswith(
      "control_dependencies_of_compute_gradients") for op in consumers):
    return "a control dependency of the optimizer's minimize/apply_gradients"
  if _op(context.towers[0].spec.train_op) in consumers:
    return "grouped into the train_op"
  if consumers:
    return f"a control dependency of `{consumers[0].name}`"
  return "an input of the train_op"


def _peer(write, tower, context: _Context):
  """Tower `tower`'s write matching tower 0's `write`, or None."""
  op = _counterpart(write.op, tower, context.tower_ops)
  if op is None:
    return None
  matching = [w for w in writes_lib.writes_of(op) if w.kind == write.kind]
  return matching[0] if len(matching) == 1 else None


def _counterpart(op, tower, tower_ops: dict):
  """Tower `tower`'s op in the place of tower 0's `op`: at the same position
  among the ops of its type each tower built, else by name."""
  mine = [o for o in tower_ops.get(0, []) if o.type == op.type]
  theirs = [o for o in tower_ops.get(tower.index, []) if o.type == op.type]
  if op in mine and len(mine) == len(theirs):
    return theirs[mine.index(op)]
  try:
    return op.graph.get_operation_by_name(f"{tower.name}/{op.name}")
  except KeyError:
    return None


# Variables the train_op updates from tower 0's shard only (`check_towers`).
STATE_COLLECTION = "estimator_multigpu_train_op_state_updates"


def _warn(inexact: list) -> None:
  """One WARNING for the writes that stay tower 0's shard's (once per model
  and mode), naming each variable, its op and how it runs."""
  if not inexact:
    return
  names = []
  for write, how in inexact:
    tf1.add_to_collection(STATE_COLLECTION, write.variable.name)
    names.append(f"`{write.variable.name}` ({write.kind}, {how})")
  count = (f"{len(names)} variables: " if len(names) > 1 else "")
  warn_once.warn(
      "state_update",
      "multi_gpu: the model_fn updates %s%s from tower 0's shard only: the "
      "value written depends on the tower's batch and is not one of the "
      "global batch. Compute it over the global batch with "
      "`emg.cross_tower_sum` (e.g. center loss: the per-class counts and "
      "sums) or `emg.cross_tower_moments` (batch-norm moving averages; or "
      "use tf.compat.v1.layers.BatchNormalization with "
      "multi_gpu(sync_batch_norm=True)), or put the update in UPDATE_OPS.",
      count, ", ".join(names))


def peer_collectives(reached: set) -> list:
  """Towers 1..'s collectives matching those tower 0's train_op runs (by
  instance key): a collective waits for every tower of its group."""
  keys = ({_instance_key(op) for op in reached if dataflow.is_collective(op)}
          - {None})
  if not keys:
    return []
  graph = next(iter(reached)).graph
  return [op for op in graph.get_operations()
          if dataflow.is_collective(op) and op not in reached
          and _instance_key(op) in keys]


def _instance_key(op):
  names = [arg.name for arg in op.op_def.input_arg]
  if "instance_key" in names:
    key = tf.get_static_value(op.inputs[names.index("instance_key")])
    return None if key is None else int(key)
  return op.get_attr("instance_key") if "instance_key" in op.node_def.attr \
      else None


def _runs(roots, stop=frozenset()) -> set:
  """What running `roots` (ops or tensors) runs: their ancestors along data
  and control edges, through an `IdentityN` output by output."""
  return dataflow.ancestors(roots, control=True, stop=stop, per_output=True)


def _op(item):
  return item if isinstance(item, tf.Operation) else item.op
