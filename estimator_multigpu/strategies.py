"""Variable strategies: where variables live and how gradients become one update.

The plan names the strategy (`multi_gpu(variable_update=...)`, chosen per
graph like tensorpack's graph builders); everything else, splitting, spec
merging, EMA, talks to it through three calls:

- `placement(tower)`: the device (string or device function) for the tower's
  ops and variables;
- `sharing_scope(tower)`: how the tower gets its variables;
- `apply_gradients(towers, clip_norm)`: the ops that turn the gradients every
  tower recorded through `TowerOptimizer` into one update per step.

`SharedVariables` ("shared", tf_cnn_benchmarks' `parameter_server`,
tensorpack's `SyncMultiGPUTrainerParameterServer`) keeps one copy on the
aggregation device. `replicated.ReplicatedVariables` ("replicated",
tf_cnn_benchmarks' `replicated`, tensorpack's
`SyncMultiGPUTrainerReplicated`) keeps a copy per tower and all-reduces the
gradients; it is used for TRAIN graphs only (`make_strategy`).

Where the other round-2 features plug in, without touching a strategy:
synchronized batch norm is a per-tower scope (`towers.build_towers`'
`tower_scopes`) that exchanges moments between towers inside the forward
pass; gradient accumulation and float16 loss scaling wrap the apply
(`updates.UpdateRule`: accumulators on the aggregation device, one update
every k-th step; skip a non-finite one).
"""

from __future__ import annotations

import abc
import contextlib
from typing import Any, Callable, Optional

import tensorflow as tf

from estimator_multigpu import gradients as gradients_lib
from estimator_multigpu import sharing

tf1 = tf.compat.v1

_VARIABLE_OPS = frozenset([
    "Variable", "VariableV2", "VarHandleOp", "AutoReloadVariable",
    "MutableHashTable", "MutableHashTableV2", "MutableHashTableOfTensors",
    "MutableHashTableOfTensorsV2", "MutableDenseHashTable",
    "MutableDenseHashTableV2"])


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



class VariableStrategy(abc.ABC):
  """How towers share variables and combine gradients, for one plan."""

  name = ""

  def __init__(self, plan: Any):
    self.plan = plan

  @abc.abstractmethod
  def placement(self, tower: Any) -> Any:
    """The tower's device string or device function (None: no placement)."""

  @abc.abstractmethod
  def sharing_scope(self, tower: Any):
    """A context manager in which `tower` creates or gets its variables."""

  @abc.abstractmethod
  def apply_gradients(self, towers: list,
                      clip_norm: Optional[float]) -> list:
    """The ops that apply the towers' recorded gradients once per step."""


class SharedVariables(VariableStrategy):
  """One copy of each variable, on the aggregation device; one update.

  Tower 0 creates the variables (placed on `plan.variable_device`), towers 1..
  read them; the towers' weighted gradients are summed on the aggregation
  device and the wrapped optimizer applies them once.
  """

  name = "shared"

  def __init__(self, plan: Any):
    super().__init__(plan)
    self._sharing = sharing.VariableSharing()
    self._globals_after_tower0: set = set()

  def placement(self, tower: Any) -> Any:
    if tower.device is None:
      return None
    variable_device = self.plan.variable_device
    return (device_function(tower.device, variable_device)
            if variable_device else tower.device)

  @contextlib.contextmanager
  def sharing_scope(self, tower: Any):
    if tower.index == 0:
      with self._sharing.tower0_scope():
        yield
      self._sharing.finish_tower0()
      self._globals_after_tower0 = {v.op.name for v in tf1.global_variables()}
      return
    substitute = self.substitute(tower)
    with sharing.reuse_scope_for_get_variable(tower, substitute), \
        self._sharing.reuse_scope(tower, substitute):
      yield
    sharing.check_no_new_globals(tower, self._globals_after_tower0)

  def substitute(self, tower: Any) -> Optional[Callable]:
    """What tower 1.. gets instead of tower 0's variable (None: that one)."""
    del tower
    return None

  def apply_gradients(self, towers: list,
                      clip_norm: Optional[float]) -> list:
    return gradients_lib.apply_tower_gradients(
        towers, self.plan.aggregation_device, clip_norm)


def _replicated(plan: Any) -> VariableStrategy:
  from estimator_multigpu import replicated  # pylint: disable=g-import-not-at-top
  return replicated.ReplicatedVariables(plan)


# Strategy name -> factory(plan).
STRATEGIES = {SharedVariables.name: SharedVariables, "replicated": _replicated}


def make_strategy(plan: Any, mode: str = "train") -> VariableStrategy:
  """The strategy object the plan names; "shared" for EVAL and PREDICT.

  Only training updates variables, so only TRAIN graphs replicate them;
  evaluation and prediction towers read tower 0's variables.
  """
  name = plan.variable_update if mode == "train" else SharedVariables.name
  return STRATEGIES[name](plan)
