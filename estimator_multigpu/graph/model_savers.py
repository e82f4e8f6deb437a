"""The Savers and Scaffold a model_fn builds, completed with what came later.

On one device the model_fn calls `minimize` before it builds its own `Saver`
(Object Detection's `Saver(sharded=True)`, a `var_list` from
`tf.compat.v1.global_variables()`), so the optimizer's slots are in it. With
`multi_gpu` the combined update, and with it the slots, is built after the
towers return, and the package adds its own state then too (EMA shadows, the
float16 loss scale): a Saver built in the model_fn would write checkpoints
without them, and a resume would stop at "Variables not initialized".

`complete` rebuilds each such Saver (the scaffold's, and those the model_fn
put in the SAVERS collection) with the same settings (`sharded`,
`max_to_keep`, `keep_checkpoint_every_n_hours`, ...) and its `var_list` kept
as given, plus what one device's Saver would have held of the variables
created after it:

- a Saver of every variable there was (`Saver()`, `var_list` of
  `tf.compat.v1.global_variables()`, as a list or a dict): every global
  variable created after it;
- a partial or renamed one (a backbone, `{"pretrained/w": w}`): only the
  slots and averages of its own variables (a variable colocated with one of
  them: optimizer slots, `ExponentialMovingAverage` shadows), named after
  it as the Saver names it (`pretrained/w/Momentum`).

A dict `var_list` gets `{name: variable}` entries. A Scaffold's own
`init_op` built in the model_fn also initializes the later variables, and
its own `local_init_op` the later local variables (replicated copies, the
towers' metric state) and lookup tables (towers 1..'s tables).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from estimator_multigpu import compat

tf1 = tf.compat.v1


def complete(spec: tf.estimator.EstimatorSpec) -> tf.estimator.EstimatorSpec:
  """`spec` whose scaffold's Saver, init_op and SAVERS cover every variable
  created after them."""
  savers = tf1.get_collection_ref(tf1.GraphKeys.SAVERS)
  scaffold = spec.scaffold
  own = scaffold is not None and any(
      field is not None for field in (scaffold.saver, scaffold.init_op,
                                      scaffold.local_init_op))
  if not savers and not own:
    return spec
  order = _creation_order()
  replaced = {}
  for index, saver in enumerate(savers):
    replaced[id(saver)] = savers[index] = _completed_saver(saver, order)
  if not own:
    return spec
  saver = scaffold.saver
  if saver is not None:
    saver = replaced.get(id(saver)) or _completed_saver(saver, order)
  return spec._replace(scaffold=tf1.train.Scaffold(
      saver=saver, init_op=_completed_init_op(scaffold.init_op, order),
      local_init_op=_completed_local_init_op(scaffold.local_init_op, order),
      copy_from_scaffold=scaffold))


def _creation_order() -> dict:
  """Each op of the default graph -> its position in creation order."""
  return {op: index for index, op in
          enumerate(tf1.get_default_graph().get_operations())}


def _later_variables(op: Any, order: dict, local: bool = False) -> list:
  """The global (`local`: local) variables created after `op`."""
  position = order.get(op, len(order))
  variables = tf1.local_variables() if local else tf1.global_variables()
  return [v for v in variables if order.get(v.op, -1) > position]


def _completed_saver(saver: tf1.train.Saver, order: dict) -> tf1.train.Saver:
  """`saver`, or a new one with its settings and the variables it lacks."""
  if not compat.private(saver, "_is_built"):
    return saver  # built later, by the scaffold: it lists everything then.
  save_op = tf1.get_default_graph().as_graph_element(
      saver.saver_def.save_tensor_name).op
  var_list = compat.private(saver, "_var_list")
  own = {_op_name(item): item for item in _items(var_list)}
  later = [v for v in _later_variables(save_op, order) if v.op.name not in own]
  if not _saves_everything_before(own, save_op, order):
    later = [v for v in later if _owner(v, own) is not None]
  if not later:
    return saver
  if isinstance(var_list, dict):
    names = {id(value): key for key, value in var_list.items()}
    var_list = {**{_key(v, own, names): v for v in later}, **var_list}
  else:
    var_list = list(var_list) + later
  return tf1.train.Saver(var_list=var_list, **_settings(saver))


def _saves_everything_before(own: dict, save_op: Any, order: dict) -> bool:
  """Whether the Saver holds every global variable created before it."""
  position = order.get(save_op, len(order))
  return all(v.op.name in own for v in tf1.global_variables()
             if order.get(v.op, len(order)) < position)


def _owner(variable: Any, own: dict) -> Any:
  """The Saver's variable `variable` is a slot or an average of (colocated
  with it), or None."""
  for group in variable.op.colocation_groups():
    name = group.decode()[len("loc:@"):]
    if name != variable.op.name and name in own:
      return own[name]
  return None


def _key(variable: Any, own: dict, names: dict) -> str:
  """The name a dict Saver saves `variable` under: its owner's key plus
  the slot's suffix (`pretrained/w` + `/Momentum`), else its own name."""
  owner = _owner(variable, own)
  if owner is None or id(owner) not in names or not variable.op.name.startswith(
      owner.op.name + "/"):
    return variable.op.name
  return names[id(owner)] + variable.op.name[len(owner.op.name):]


def _settings(saver: tf1.train.Saver) -> dict:
  """The constructor arguments `saver` was built with (but its var_list)."""
  return {name: compat.private(saver, "_" + name) for name in (
      "reshape", "sharded", "max_to_keep", "keep_checkpoint_every_n_hours",
      "restore_sequentially", "allow_empty", "write_version",
      "pad_step_number", "save_relative_paths", "filename")}


def _items(var_list: Any) -> list:
  """The variables (partitions, saveables) a Saver's `var_list` names."""
  items = list(var_list.values()) if isinstance(var_list, dict) else list(
      var_list)
  flat, partitioned = [], compat.internal("variables").PartitionedVariable
  for item in items:
    flat.extend(item if isinstance(item, (list, tuple)) else
                list(item) if isinstance(item, partitioned) else [item])
  return flat


def _op_name(item: Any) -> str:
  op = getattr(item, "op", None)
  return op.name if op is not None else str(getattr(item, "name", item))


def _completed_init_op(init_op: Any, order: dict) -> Any:
  """`init_op`, grouped with the initializers of variables created after
  it."""
  if init_op is None:
    return None
  later = _later_variables(getattr(init_op, "op", init_op), order)
  if not later:
    return init_op
  return tf.group(init_op, tf1.variables_initializer(later),
                  name="init_op_with_later_variables")


def _completed_local_init_op(local_init_op: Any, order: dict) -> Any:
  """`local_init_op`, grouped with what towers 1.. (and the package) made
  after it: the initializers of later local variables (replicated copies,
  metric state) and of later lookup tables (TABLE_INITIALIZERS)."""
  if local_init_op is None:
    return None
  op = getattr(local_init_op, "op", local_init_op)
  position = order.get(op, len(order))
  tables = [t for t in tf1.get_collection(tf1.GraphKeys.TABLE_INITIALIZERS)
            if order.get(getattr(t, "op", t), -1) > position]
  later = _later_variables(op, order, local=True)
  if not tables and not later:
    return local_init_op
  return tf.group(local_init_op, tf1.variables_initializer(later), *tables,
                  name="local_init_op_with_later_ones")
