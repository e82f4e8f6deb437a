"""Towers: call the model_fn once per device, with shared variables.

Tower 0 is built exactly like the unwrapped model_fn (no name prefix, no
reuse), so its variables get the single-device names. Towers 1.. run under the
name scope `tower_<i>`, reuse every variable tower 0 created (through
`get_variable` reuse for tf-slim and `tf.compat.v1.layers`, through a variable
creator for Keras layers, `tf.Variable` and streaming-metric state) and see
graph collections (losses, update ops, summaries) holding only their own
items, so code such as `tf.compat.v1.losses.get_total_loss()` inside the
model_fn means the same thing in every tower.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Callable, Optional

import tensorflow as tf
from tensorflow.python.ops import variable_scope as vs_lib  # pylint: disable=g-direct-tensorflow-import

from estimator_multigpu import devices as devices_lib

tf1 = tf.compat.v1

# Graph collections a tower sees only its own items in; towers 1.. leave
# nothing behind in them (summaries, update ops and losses come from tower 0).
ISOLATED_COLLECTIONS = (tf1.GraphKeys.LOSSES, tf1.GraphKeys.UPDATE_OPS,
                        tf1.GraphKeys.SUMMARIES,
                        tf1.GraphKeys.REGULARIZATION_LOSSES)

_VARIABLE_OPS = frozenset([
    "Variable", "VariableV2", "VarHandleOp", "AutoReloadVariable",
    "MutableHashTable", "MutableHashTableV2", "MutableHashTableOfTensors",
    "MutableHashTableOfTensorsV2", "MutableDenseHashTable",
    "MutableDenseHashTableV2"])


@dataclasses.dataclass
class OptimizerCall:
  """One `TowerOptimizer.apply_gradients` call made inside a tower.

  The variable and name scopes of the call are kept so the combined update
  is built where the unwrapped model_fn would build it (optimizer slots such
  as `OptimizeLoss/w/Momentum` then get the single-device names).
  """
  optimizer: Any  # the TowerOptimizer that recorded the call.
  grads_and_vars: list
  global_step: Optional[tf.Variable]
  name: Optional[str]
  variable_scope: Any = None
  name_scope: str = ""

  @contextlib.contextmanager
  def scopes(self):
    """Re-enters the call's variable scope and name scope."""
    graph = tf1.get_default_graph()
    with tf1.variable_scope(self.variable_scope, auxiliary_name_scope=False), \
        graph.name_scope(self.name_scope + "/" if self.name_scope else ""):
      yield


@dataclasses.dataclass
class Tower:
  """One call of the model_fn and what it left behind.

  Attributes:
    index: the tower's position; tower 0 holds the unprefixed names.
    device: canonical device string, or None for no placement (export).
    gradient_weight: what each gradient of the tower's loss is scaled by
      (n_i / n for "mean", 1 for "sum"; 0 for an empty shard).
    optimizer_calls: `TowerOptimizer` calls recorded, in call order.
    collections: the items the tower added to `ISOLATED_COLLECTIONS`.
    spec: the EstimatorSpec the model_fn returned.
    group: the tower's devices (model parallelism); `device` is the first.
  """
  index: int
  device: Optional[str]
  gradient_weight: Any = 1.0
  optimizer_calls: list = dataclasses.field(default_factory=list)
  collections: dict = dataclasses.field(default_factory=dict)
  spec: Any = None
  group: list = dataclasses.field(default_factory=list)

  @property
  def name(self) -> str:
    return f"tower_{self.index}"


_CURRENT = threading.local()


def current_tower() -> Optional[Tower]:
  """The tower being built on this thread, or None outside `multi_gpu`."""
  return getattr(_CURRENT, "tower", None)


@contextlib.contextmanager
def _entered(tower: Tower):
  previous = current_tower()
  _CURRENT.tower = tower
  try:
    yield
  finally:
    _CURRENT.tower = previous


def device_function(tower_device: str, variable_device: str) -> Callable:
  """Places variables on `variable_device`, every other op on the tower's.

  Devices already set by an inner `tf.device` win field by field, as with
  `tf.compat.v1.train.replica_device_setter`.
  """
  tower_spec = tf.DeviceSpec.from_string(tower_device)
  variable_spec = tf.DeviceSpec.from_string(variable_device)

  def choose(op) -> str:
    op_type = op.type if isinstance(op, tf.Operation) else op.op  # NodeDef.
    spec = variable_spec if op_type in _VARIABLE_OPS else tower_spec
    current = tf.DeviceSpec.from_string(op.device or "")
    return spec.make_merged_spec(current).to_string()

  return choose


class VariableSharing:
  """Hands tower 0's variables back when towers 1.. create them again.

  `get_variable` reuse covers tf-slim and `tf.compat.v1.layers`. Keras layers,
  `tf.Variable` and metric state go straight to the variable creators, so
  tower 0 records what it creates that way and towers 1.. get those
  variables back in creation order (shape and dtype checked).
  """

  def __init__(self):
    self._tower0: list = []
    self._store_before: set = set()

  def tower0_scope(self):
    """Records the variables tower 0 creates outside `get_variable`."""
    self._store_before = set(_variable_store_names())

    def record(next_creator, **kwargs):
      variable = next_creator(**kwargs)
      self._tower0.append(variable)
      return variable

    return tf1.variable_creator_scope(record)

  def finish_tower0(self) -> None:
    """Drops what `get_variable` made: reuse covers those."""
    store = set(_variable_store_names()) - self._store_before
    self._tower0 = [v for v in self._tower0 if v.op.name not in store]

  @contextlib.contextmanager
  def reuse_scope(self, tower: Tower):
    """Serves tower `tower`'s creations from tower 0's, in order."""
    served = []

    def reuse(next_creator, **kwargs):
      del next_creator
      return self._serve(tower, len(served), kwargs, served)

    with tf1.variable_creator_scope(reuse):
      yield
    if len(served) != len(self._tower0):
      raise ValueError(
          f"Tower {tower.index} created {len(served)} variables outside "
          f"`get_variable` but tower 0 created {len(self._tower0)}. The "
          "model_fn must create the same variables in every tower; create "
          "every variable unconditionally.")

  def _serve(self, tower: Tower, position: int, kwargs: dict, served: list):
    name = kwargs.get("name") or "<unnamed>"
    if position >= len(self._tower0):
      raise ValueError(
          f"Tower {tower.index} creates variable `{name}`, which tower 0 did "
          "not create: a variable must be created in every tower (tower 0 "
          "builds it, the others reuse it). Create it unconditionally.")
    variable = self._tower0[position]
    _check_additive(name, kwargs)
    shape = kwargs.get("shape")
    if shape is not None and tf.TensorShape(shape) != variable.shape:
      raise ValueError(
          f"Tower {tower.index} creates variable `{name}` with shape "
          f"{tf.TensorShape(shape)} where tower 0's matching variable "
          f"`{variable.op.name}` has shape {variable.shape}. The model_fn "
          "must build the same variables, in the same order, in every tower.")
    served.append(variable)
    return variable


_METRIC_COLLECTIONS = (tf1.GraphKeys.METRIC_VARIABLES,
                       tf1.GraphKeys.LOCAL_VARIABLES)


def _check_additive(name: str, kwargs: dict) -> None:
  """Metric state is shared by the towers, which is exact only if additive."""
  collections = kwargs.get("collections") or ()
  if not any(key in collections for key in _METRIC_COLLECTIONS):
    return
  aggregation = kwargs.get("aggregation")
  if aggregation != tf.VariableAggregation.SUM:
    raise ValueError(
        f"The metric state variable `{name}` declares aggregation "
        f"{getattr(aggregation, 'name', aggregation)}. `multi_gpu` computes "
        "a metric over all towers by letting every tower add into one shared "
        "state, which is exact only for additive state (totals, counts): "
        "declare it with aggregation=tf.VariableAggregation.SUM if it is "
        "additive, or compute this metric outside the towers.")


def _variable_store_names() -> list:
  """Names of the variables `get_variable` holds in this graph."""
  store = vs_lib._get_default_variable_store()  # pylint: disable=protected-access
  return list(store._vars)  # pylint: disable=protected-access


@dataclasses.dataclass(frozen=True)
class GraphState:
  """What towers 1.. must see as it was before tower 0 was built."""
  collections: dict
  scope_counts: dict

  @classmethod
  def capture(cls) -> "GraphState":
    graph = tf1.get_default_graph()
    return cls({key: list(graph.get_collection(key))
                for key in ISOLATED_COLLECTIONS}, dict(_scope_counts()))


def _scope_counts() -> dict:
  """How often each default variable-scope name was used (for `dense_1`)."""
  return vs_lib.get_variable_scope_store().variable_scopes_count


def _set_scope_counts(counts: dict) -> None:
  current = _scope_counts()
  current.clear()
  current.update(counts)


@contextlib.contextmanager
def isolated_graph_state(tower: Tower, before_tower0: GraphState):
  """Shows tower 1.. the collections and default names tower 0 saw.

  Inside the tower, `ISOLATED_COLLECTIONS` hold only the tower's own items
  (REGULARIZATION_LOSSES also keeps tower 0's, which belong to the shared
  variables), and default names restart, so an unnamed
  `tf.compat.v1.layers.dense` maps to tower 0's `dense` scope.
  """
  graph = tf1.get_default_graph()
  kept = GraphState.capture()
  if tower.index > 0:
    for key in ISOLATED_COLLECTIONS:
      visible = (kept.collections[key]
                 if key == tf1.GraphKeys.REGULARIZATION_LOSSES
                 else before_tower0.collections[key])
      graph.get_collection_ref(key)[:] = visible
    _set_scope_counts(before_tower0.scope_counts)
  start = {key: len(graph.get_collection(key)) for key in ISOLATED_COLLECTIONS}
  try:
    yield
  finally:
    for key in ISOLATED_COLLECTIONS:
      tower.collections[key] = graph.get_collection(key)[start[key]:]
      if tower.index > 0:
        graph.get_collection_ref(key)[:] = kept.collections[key]
    if tower.index > 0:
      _set_scope_counts(kept.scope_counts)


@contextlib.contextmanager
def tower_scope(tower: Tower, variable_device: Optional[str]):
  """Device, name scope and variable reuse for one tower."""
  with contextlib.ExitStack() as stack:
    if tower.device is not None:
      placement = (device_function(tower.device, variable_device)
                   if variable_device else tower.device)
      stack.enter_context(tf1.device(placement))
    if tower.index > 0:
      stack.enter_context(tf1.variable_scope(tf1.get_variable_scope(),
                                             reuse=True))
      stack.enter_context(tf1.name_scope(tower.name))
    stack.enter_context(_entered(tower))
    yield


def check_no_new_globals(tower: Tower, before: set) -> None:
  """Raises if tower 1.. created global variables (it must reuse tower 0's)."""
  created = [v.op.name for v in tf1.global_variables()
             if v.op.name not in before]
  if created:
    raise ValueError(
        f"Tower {tower.index} created variables that tower 0 did not: "
        f"{', '.join(created)}. A variable must be created in every tower "
        "(tower 0 builds it, the others reuse it); do not create variables "
        "conditionally or under `reuse=tf.compat.v1.AUTO_REUSE` per tower.")


def short_device(tower: Tower) -> str:
  return devices_lib.short_name(tower.device) if tower.device else "(none)"
