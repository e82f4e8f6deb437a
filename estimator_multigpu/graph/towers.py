"""Towers: call a function once per device of the plan, on its shard.

`build_towers` is the one tower loop, used by `multi_gpu` (the function is the
model_fn) and `make_parallel`. Tower 0 is built exactly like the unwrapped
function (no name prefix), so its variables get the single-device names.
Towers 1.. run under the name scope `tower_<i>`, get their variables from the
plan's variable strategy (`strategies`: tower 0's shared ones today) and see
graph collections (losses, update ops, summaries) holding only their own
items, so code such as `tf.compat.v1.losses.get_total_loss()` inside the
model_fn means the same thing in every tower.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu import devices as devices_lib
from estimator_multigpu.graph import sharing

vs_lib = compat.internal("variable_scope")
tf1 = tf.compat.v1

# (ratio, global denominator) of every `cross_tower.global_ratio` (gradient
# accumulation weighs micro-batches by the denominator: `update.accumulation`).
NORMALIZERS = "estimator_multigpu_global_normalizers"

# Graph collections a tower sees only its own items in; towers 1.. leave
# nothing behind in them (summaries, update ops, losses and the Savers the
# model_fn builds come from tower 0).
ISOLATED_COLLECTIONS = (tf1.GraphKeys.LOSSES, tf1.GraphKeys.UPDATE_OPS,
                        tf1.GraphKeys.SUMMARIES, tf1.GraphKeys.SAVERS,
                        tf1.GraphKeys.REGULARIZATION_LOSSES,
                        NORMALIZERS)

@dataclasses.dataclass
class OptimizerCall:
  """One `TowerOptimizer.apply_gradients` call made inside a tower.

  The variable and name scopes of the call are kept so the combined update
  is built where the unwrapped model_fn would build it (optimizer slots such
  as `OptimizeLoss/w/Momentum` then get the single-device names).
  """
  optimizer: Any  # the TowerOptimizer that recorded the call.
  grads_and_vars: list  # already scaled by the tower's `loss_weight`.
  global_step: Optional[tf.Variable]
  name: Optional[str]
  variable_scope: Any = None
  name_scope: str = ""
  recorded: Any = None  # the no-op the call returned to the model_fn.
  branch: Any = None  # the tf.cond branch (function graph) it was made in.
  signature: Any = None  # `update.clipping.signature` of its gradients.

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
    loss_weight: the tower's share of the global batch, which its loss and
      (in `TowerOptimizer.apply_gradients`) its gradients are scaled by
      (`splitting.Split.loss_weight`: nᵢ / n for "mean", 1 for "sum", 0 for
      an empty shard).
    group: the tower's devices (model parallelism); `device` is the first.
    num_towers: how many towers the plan has.
    optimizer_calls: `TowerOptimizer` calls recorded, in call order.
    collections: the items the tower added to `ISOLATED_COLLECTIONS`.
    output: what the tower's function returned (the model_fn's spec).
    local_variables: tower 0's variable name -> this tower's own copy
      (variable_update="replicated"; empty when variables are shared).
    loss_scaled_gradients: ids of the gradients `TowerOptimizer` computed
      from the loss-scaled loss (float16 mixed precision).
    deferred_dependencies: no-ops holding the control dependencies that were
      around tower 0's `TowerOptimizer.compute_gradients` (usually its
      UPDATE_OPS); the train op runs them, the gradients don't wait for them.
    branch_gradients: ids of the gradients `TowerOptimizer` computed, outside
      the tf.cond, for a call made inside a tf.cond branch (`triggers`).
    var_lists: the `var_list` of each `TowerOptimizer.compute_gradients`
      call; `tower0_var_lists`: tower 0's (replicated towers use those).
  """
  index: int
  device: Optional[str]
  loss_weight: Any = 1.0
  group: list = dataclasses.field(default_factory=list)
  num_towers: int = 1
  optimizer_calls: list = dataclasses.field(default_factory=list)
  collections: dict = dataclasses.field(default_factory=dict)
  output: Any = None
  local_variables: dict = dataclasses.field(default_factory=dict)
  loss_scaled_gradients: set = dataclasses.field(default_factory=set)
  deferred_dependencies: list = dataclasses.field(default_factory=list)
  branch_gradients: set = dataclasses.field(default_factory=set)
  var_lists: list = dataclasses.field(default_factory=list)
  tower0_var_lists: list = dataclasses.field(default_factory=list)

  @property
  def name(self) -> str:
    return f"tower_{self.index}"

  @property
  def spec(self) -> Any:
    """The EstimatorSpec a model_fn tower returned (same as `output`)."""
    return self.output

  def step_ops(self) -> list:
    """What every step runs of this tower besides the update: its train_op,
    UPDATE_OPS and deferred control dependencies (tower 0's only)."""
    return [self.spec.train_op,
            *self.collections.get(tf1.GraphKeys.UPDATE_OPS, []),
            *self.deferred_dependencies]


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
def tower_scope(tower: Tower, placement: Any):
  """Device (a device string or function), name scope and `current_tower`."""
  with contextlib.ExitStack() as stack:
    if placement is not None:
      stack.enter_context(tf1.device(placement))
    if tower.index > 0:
      stack.enter_context(tf1.name_scope(tower.name))
    stack.enter_context(_entered(tower))
    yield


TowerCall = Callable[[Tower, Any], Any]
ScopeFactory = Callable[[Tower], Any]


def build_towers(call: TowerCall, plan: Any, shards: Sequence[Any],
                 strategy: Any, *, loss_weights: Optional[Sequence] = None,
                 api: str = "multi_gpu", hint: str = "",
                 tower_scopes: Sequence[ScopeFactory] = ()) -> list[Tower]:
  """Calls `call(tower, shard)` once per tower of `plan`; returns the towers.

  Args:
    call: builds one tower's ops from its shard; its result is `Tower.output`.
    plan: a `plan.Plan` (the towers' device groups).
    shards: one input per tower, in tower order.
    strategy: the plan's `strategies.VariableStrategy`: where each tower's
      ops and variables go and how towers 1.. get their variables.
    loss_weights: per tower, its share of the global batch (default 1).
    api: the public name in error messages (`multi_gpu`, `make_parallel`).
    hint: advice appended to variable-mismatch errors.
    tower_scopes: factories of context managers entered around each call,
      innermost (synchronized batch norm plugs in here).

  Raises:
    sharing.VariableMismatchError: a tower 1.. did not create tower 0's
      variables (the message names the tower, its device and the variable).
  """
  before_tower0 = GraphState.capture()
  towers = []
  for index, group in enumerate(plan.groups):
    tower = Tower(index, group[0],
                  loss_weights[index] if loss_weights else 1.0,
                  group=list(group), num_towers=plan.num_towers,
                  tower0_var_lists=towers[0].var_lists if towers else [])
    with _explained_mismatch(tower, api, hint), \
        strategy.sharing_scope(tower), \
        tower_scope(tower, strategy.placement(tower)), \
        isolated_graph_state(tower, before_tower0), \
        contextlib.ExitStack() as stack:
      for make_scope in tower_scopes:
        stack.enter_context(make_scope(tower))
      tower.output = call(tower, shards[index])
    towers.append(tower)
  return towers


@contextlib.contextmanager
def _explained_mismatch(tower: Tower, api: str, hint: str):
  """Says which tower and device broke the same-variables rule, and how."""
  try:
    yield
  except sharing.VariableMismatchError as error:
    raise sharing.VariableMismatchError(
        f"`{api}` tower {tower.index} ({short_device(tower)}) did not create "
        f"the variables tower 0 created. {error} The function must create "
        "the same variables, in the same order, in every tower, "
        f"unconditionally.{hint}") from error


def short_device(tower: Tower) -> str:
  return devices_lib.short_name(tower.device) if tower.device else "(none)"
