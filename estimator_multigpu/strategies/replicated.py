"""Replicated variables: a copy per tower, all-reduced gradients.

tf_cnn_benchmarks' `replicated` mode, tensorpack's
`SyncMultiGPUTrainerReplicated`, what MirroredStrategy and Horovod do:

- Tower 0 builds exactly like the unwrapped model_fn, on its own device: its
  variables and optimizer slots carry the single-device names, are global and
  are the only ones a checkpoint holds.
- Towers 1.. get their own copy of every trainable variable tower 0 has,
  `tower_<i>/<name>`, on their device, in LOCAL_VARIABLES (never saved).
  `TowerOptimizer.compute_gradients` in tower i differentiates the copies
  but pairs the gradients with tower 0's variables (single-device names:
  multipliers chosen by a regex on `var.op.name` or keyed by tower 0's
  variables match), over tower 0's `var_list` of the same call (a list
  filtered by op name in Python is empty in tower i). A transform that
  treats tower i's gradients differently (a dict keyed by the tower's own
  copy) is a WARNING (`base.warn_if_transformed_differently`). A copy's
  initializer reads tower 0's variable, and Estimator runs the local
  initializers after the global ones or a restore, so the copies start
  equal to tower 0's values, restored or fresh. Inside tower i,
  `trainable_variables()` lists the tower's copies and REGULARIZATION_LOSSES
  their regularizers (a `get_variable` regularizer is applied to the copy).
  The rest (batch-norm statistics, metric state, `global_step`) is tower
  0's, shared as in "shared" mode.
- Each step the towers' weighted gradients are all-reduced (`all_reduce`) and
  every tower applies the same sum with its own copy of the optimizer, whose
  slots (`tower_<i>/<tower 0's slot name>`) are local too and start from
  tower 0's. Identical inputs and identical ops keep the copies bit-identical.
  `global_step` is given to tower 0's apply only, so it moves as the
  wrapped optimizer moves it on one device (BERT's leaves it alone).
  Optimizer state made with `get_variable` (BERT's and LAMB's
  `param_name + "/adam_m"`) is renamed `tower_<i>/...` in tower i's apply,
  so it becomes a local copy too; a partitioned variable gets a partitioned
  copy. An apply that writes a variable no tower copies (state made in the
  model_fn, `global_step` itself) is refused: it would move once per tower.

Only TRAIN replicates: EVAL and PREDICT make no update, so their towers read
tower 0's variables as in "shared" mode.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu.cross_tower import regularization
from estimator_multigpu.strategies import all_reduce as all_reduce_lib
from estimator_multigpu.strategies import base
from estimator_multigpu.strategies import replicated_refusals as refusals
from estimator_multigpu.strategies import shared

ref_variable = compat.internal("ref_variable")
resource_variable_ops = compat.internal("resource_variable_ops")
variables_lib = compat.internal("variables")
tf1 = tf.compat.v1


# What tower 1.. sees of its own only: its copies, and their regularizers.
_PER_TOWER_COLLECTIONS = (tf1.GraphKeys.TRAINABLE_VARIABLES,
                          tf1.GraphKeys.REGULARIZATION_LOSSES)


def local_copy(original: tf.Variable, name: str, trainable: bool):
  """A LOCAL variable on the current device initialized from `original`.

  Its initializer reads `original`'s current value, so running the local
  initializers after a restore copies the restored value. A resource
  variable's copy answers `name` with `original`'s name; its op is `name`.
  """
  graph = tf1.get_default_graph()
  with tf.control_dependencies(None), graph.name_scope(None):
    with graph.name_scope(name.split("/", 1)[0] + "/copy_from_tower_0/"), \
        tf1.colocate_with(original, ignore_existing=True):
      value = tf.identity(original)
    kwargs = dict(initial_value=value, trainable=trainable, name=name,
                  collections=[tf1.GraphKeys.LOCAL_VARIABLES],
                  dtype=original.dtype.base_dtype)
    if not resource_variable_ops.is_resource_variable(original):
      return ref_variable.RefVariable(**kwargs)
    replica = _TowerCopy(original=original, **kwargs)
  # Its `name` is tower 0's (its op is `tower_<i>/...`), so the model_fn's
  # filters by name or scope (`var_list` of a frozen backbone) pick the
  # same variables in every tower.
  compat.set_private(replica, "_handle_name",
                     compat.private(original, "_handle_name"))
  return replica


class _TowerCopy(resource_variable_ops.ResourceVariable):
  """A tower's copy whose `name` is tower 0's; slots named after its op."""

  def __init__(self, *args, original=None, **kwargs):
    self._original = original  # tower 0's variable.
    super().__init__(*args, **kwargs)

  @property
  def _shared_name(self) -> str:
    return self.op.name


_OPTIMIZER_STATE = ("_slots", "_non_slot_dict", "_deferred_slot_restorations")


def fresh_optimizer(optimizer: tf1.train.Optimizer) -> tf1.train.Optimizer:
  """A copy of a TF1 optimizer with the same settings and no state yet.

  So is every optimizer it wraps (an attribute that is one: Lookahead's,
  tf.contrib's `MovingAverageOptimizer`'s), and a wrapper that never ran
  `Optimizer.__init__` (no `_slots`) or forwards every attribute through
  `__getattr__` (tf.contrib's `MultitaskOptimizerWrapper`, which
  `copy.copy` would recurse into) is copied too: attribute by attribute.
  """
  clone = object.__new__(type(optimizer))
  vars(clone).update(vars(optimizer))
  for state in _OPTIMIZER_STATE:
    if compat.private(clone, state, None, own=True) is not None:
      compat.set_private(clone, state, {})
  for name, value in vars(clone).items():
    if value is not optimizer and _is_optimizer(value):
      vars(clone)[name] = fresh_optimizer(value)
  return clone


def _is_optimizer(value) -> bool:
  """A TF1 optimizer, or an object standing for one (both methods)."""
  return isinstance(value, tf1.train.Optimizer) or (
      not isinstance(value, type) and all(
          callable(getattr(value, m, None))
          for m in ("compute_gradients", "apply_gradients")) and
      hasattr(value, "__dict__"))


class ReplicatedVariables(shared.SharedVariables):
  """A copy of the trainable variables per tower; all-reduce; N updates."""

  name = "replicated"
  variable_update = "replicated"
  copies_per_tower = True

  def __init__(self, plan):
    super().__init__(plan)
    self._replicated: set = set()  # tower 0's trainable variable names.
    self._copies: dict = {}  # (tower index, original name) -> copy.
    self._originals: dict = {}  # copy name -> original.
    self._carry: Optional[list] = None  # `carry`'s terms, one per tower.

  def placement(self, tower):
    return tower.device

  def substitute(self, tower):
    return lambda variable, regularizer=None: self.copy_for(
        tower, variable, regularizer)

  @contextlib.contextmanager
  def sharing_scope(self, tower):
    if tower.index == 0:
      with super().sharing_scope(tower):
        yield
      self._replicated = {v.op.name for v in tf1.trainable_variables()}
      return
    graph = tf1.get_default_graph()
    own = [graph.get_collection_ref(key) for key in _PER_TOWER_COLLECTIONS]
    kept = [list(collection) for collection in own]
    for collection in own:
      collection[:] = []  # the tower's copies (and their losses) join.
    try:
      with super().sharing_scope(tower):
        yield
    finally:
      for collection, items in zip(own, kept):
        collection[:] = items

  def copy_for(self, tower, variable, regularizer=None):
    """Tower `tower`'s copy of tower 0's trainable `variable` (made once).

    A `regularizer` (from `get_variable`) is applied to the new copy, its
    loss added to the tower's REGULARIZATION_LOSSES, as `get_variable` did
    for tower 0's variable.
    """
    if isinstance(variable, variables_lib.PartitionedVariable):
      return self._partitioned_copy(tower, variable, regularizer)
    if (not isinstance(variable, tf.Variable) or
        variable.op.name not in self._replicated):
      return variable
    key = (tower.index, variable.op.name)
    if key not in self._copies:
      replica = local_copy(variable, f"{tower.name}/{variable.op.name}",
                           trainable=True)
      self._copies[key] = replica
      self._originals[replica.op.name] = variable
      tower.local_variables[variable.op.name] = replica
      if regularizer is not None:
        with tf.name_scope(f"{variable.op.name}/Regularizer"):
          loss = regularization.counted(regularizer)(replica)
        if loss is not None:
          tf1.add_to_collection(tf1.GraphKeys.REGULARIZATION_LOSSES, loss)
    return self._copies[key]

  def _partitioned_copy(self, tower, variable, regularizer):
    """A partitioned variable of the tower's copies of each part (each
    regularized as `get_variable` regularized tower 0's parts)."""
    parts = [self.copy_for(tower, part, regularizer) for part in variable]
    if parts == list(variable):
      return variable  # not trainable: shared.
    for part, original in zip(parts, variable):
      compat.private(part, "_set_save_slice_info")(
          compat.private(original, "_get_save_slice_info")())
    return variables_lib.PartitionedVariable(
        f"{tower.name}/{variable.name}", variable.get_shape(),
        variable.dtype, parts, compat.private(variable, "_get_partitions")())

  def carry(self, terms: list) -> None:
    self._carry = terms

  def combine(self, towers: list) -> list:
    """All-reduces each optimizer call's gradients: one sum per tower."""
    updates = []
    for position, calls in enumerate(base.calls_by_position(towers)):
      refusals.refuse_sync_replicas(calls[0].optimizer)
      tower_pairs = [self._as_tower0_variables(call.grads_and_vars)
                     for call in calls]
      base.check_variables_line_up(tower_pairs)
      variables = [v for _, v in tower_pairs[0]]
      tower_grads = [[g for g, _ in pairs] for pairs in tower_pairs]
      base.warn_no_gradient(tower_grads, variables)
      with tf.name_scope("all_reduce"):
        summed, carried = all_reduce_lib.all_reduce(
            tower_grads, variables, [tower.device for tower in towers],
            self.plan.all_reduce, self.plan.gradient_packing_bytes,
            self.plan.aggregation_device, self.plan.collective_group,
            carry=self._carry if position == 0 else None)
      self.carried = self.carried if carried is None else carried
      updates += [base.Update(position, calls[0], tower, tower.device,
                              list(zip(grads, variables)))
                  for tower, grads in zip(towers, summed)]
    return updates

  def apply(self, updates: list,
            apply_if: Optional[tf.Tensor] = None) -> list:
    """Every tower applies its sum to its own copies; `global_step` moves
    with tower 0's apply."""
    ops = []
    for position in sorted({update.position for update in updates}):
      mine = [u for u in updates if u.position == position]
      tower0_state: list = []
      applies = [self._apply(update, tower0_state, apply_if)
                 for update in mine]
      ops.append(_step_once(applies))
    return ops

  def _as_tower0_variables(self, grads_and_vars: list) -> list:
    return [(g, self._originals.get(v.op.name, v)) for g, v in grads_and_vars]

  def _apply(self, update, tower0_state: list, apply_if):
    """Tower 0 applies as the unwrapped model_fn; towers 1.. to their copies.

    Tower 0's optimizer state is recorded in `tower0_state` in creation
    order; towers 1.. create theirs in the same order, as local copies.
    """
    tower, first = update.tower, update.call
    if tower.index == 0:
      with tf.device(tower.device), first.scopes(), \
          tf1.variable_creator_scope(_recorder(tower0_state)):
        return first.optimizer.apply_combined(
            update.grads_and_vars, first.global_step, first.name,
            apply_if=apply_if)
    pairs = [(g, self._copies[(tower.index, v.op.name)])
             for g, v in update.grads_and_vars
             if (tower.index, v.op.name) in self._copies]
    optimizer = fresh_optimizer(first.optimizer.wrapped)
    graph = tf1.get_default_graph()
    start = len(graph.get_operations())
    with tf.device(tower.device), tf1.name_scope(tower.name + "/"), \
        _tower_variable_names(tower), \
        _local_state_scope(tower, tower0_state) as made:
      applied = base.applied_if(apply_if, lambda: optimizer.apply_gradients(
          pairs, None, first.name))
    own = {v.op for v in made} | {copy.op for (index, _), copy in
                                  self._copies.items() if index == tower.index}
    refusals.refuse_shared_writes(first.optimizer.wrapped, tower,
                                  graph.get_operations()[start:], own)
    return applied


@contextlib.contextmanager
def _tower_variable_names(tower):
  """`get_variable` in tower `tower`'s apply makes `tower_<i>/<name>`.

  Optimizers that make their state with `get_variable(param_name +
  "/adam_m")` (BERT, ALBERT's LAMB) ask for tower 0's names again; renamed,
  the store makes a new variable, which `_local_state_scope` turns into
  the tower's local copy of tower 0's.
  """
  prefix = tower.name + "/"

  def rename(getter, name, *args, **kwargs):
    if not name.startswith(prefix):
      name = prefix + name
    return getter(name, *args, **kwargs)

  with tf1.variable_scope(tf1.get_variable_scope(), custom_getter=rename,
                          auxiliary_name_scope=False):
    yield


def _recorder(created: list):
  def record(next_creator, **kwargs):
    variable = next_creator(**kwargs)
    created.append(variable)
    return variable
  return record


@contextlib.contextmanager
def _local_state_scope(tower, tower0_state: list):
  """Tower `tower`'s optimizer state: local copies of tower 0's, in order."""
  made = []

  def create(next_creator, **kwargs):
    del next_creator
    if len(made) >= len(tower0_state):
      raise ValueError(
          f"Tower {tower.index}'s optimizer creates more state variables "
          f"than tower 0's ({len(tower0_state)}; this one is "
          f"`{kwargs.get('name')}`). With variable_update='replicated' every "
          "tower applies the update with a copy of the same optimizer; one "
          "whose state depends on more than its variables is not supported: "
          "use variable_update='shared'.")
    original = tower0_state[len(made)]
    made.append(local_copy(original, f"{tower.name}/{original.op.name}",
                           trainable=False))
    return made[-1]

  with tf1.variable_creator_scope(create):
    yield made


def _step_once(applies: list) -> tf.Operation:
  """Groups the towers' updates. `global_step` moves with tower 0's, as
  the wrapped optimizer moves it on one device (BERT's leaves it alone)."""
  return tf.group(*applies, name="replicated_update")
