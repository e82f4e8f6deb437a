"""The variable-strategy interface, and the checks every strategy shares.

A strategy (chosen by the plan, like tensorpack's graph builders) decides
where a tower's variables live and how the gradients every tower recorded
through `TowerOptimizer` become one update. It takes part in the update
chain (`update.chain`) at both ends:

    combine(towers) -> [Update]      one gradient per variable, per applier,
                                     on the applier's device
    ... unscale -> accumulate -> clip (the chain, per Update) ...
    apply(updates, apply_if) -> ops  the optimizer applies them

An `Update` is one optimizer call's gradients for one applier: the
aggregation device for "shared", each tower's device for "replicated".
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, Optional

from absl import logging
import tensorflow as tf

from estimator_multigpu.graph import dataflow
from estimator_multigpu.graph import warn_once

tf1 = tf.compat.v1


@dataclasses.dataclass(frozen=True)
class Update:
  """One optimizer call's gradients, for one applier, between the steps.

  Attributes:
    position: which optimizer call (call order, the same in every tower).
    call: tower 0's recorded call (optimizer, global_step, name, scopes).
    tower: the tower that applies it (tower 0 for "shared").
    device: where its gradients live and the chain's steps run.
    grads_and_vars: the gradients (covering the global batch once
      combined) and tower 0's variables.
  """
  position: int
  call: Any
  tower: Any
  device: Optional[str]
  grads_and_vars: list

  def with_gradients(self, grads_and_vars: list) -> "Update":
    return dataclasses.replace(self, grads_and_vars=list(grads_and_vars))


class VariableStrategy(abc.ABC):
  """How towers share variables and combine gradients, for one plan."""

  # The registry's traits (`strategies.STRATEGIES`).
  name = ""
  variable_update = ""  # the `variable_update` option that selects it.
  synchronization = "sync"  # the `synchronization` option that selects it.
  copies_per_tower = False  # a copy of the variables per tower (all-reduce).
  waits_for_towers = True  # one update from every tower's gradients.

  def __init__(self, plan: Any):
    self.plan = plan
    # The sum over every tower of every task of the terms given to `carry`,
    # once `combine` has all-reduced them with the gradients (else None).
    self.carried: Optional[tf.Tensor] = None

  def carry(self, terms: list) -> None:
    """Asks `combine` to sum `terms` (one scalar per tower, e.g. the
    towers' weighted losses) inside its first all-reduce of gradients, one
    barrier fewer per step; `carried` then holds the sum. A strategy that
    all-reduces nothing ignores it (`carried` stays None)."""
    del terms

  @abc.abstractmethod
  def placement(self, tower: Any) -> Any:
    """The tower's device string or device function (None: no placement)."""

  @abc.abstractmethod
  def sharing_scope(self, tower: Any):
    """A context manager in which `tower` creates or gets its variables."""

  @abc.abstractmethod
  def combine(self, towers: list) -> list:
    """The towers' recorded gradients as `Update`s, one gradient per
    variable per applier, on the applier's device."""

  @abc.abstractmethod
  def apply(self, updates: list,
            apply_if: Optional[tf.Tensor] = None) -> list:
    """The ops that apply `updates` (from `combine`, through the chain).

    Args:
      updates: what `combine` returned, with the chain's gradients.
      apply_if: a scalar bool; when it is False the step moves nothing
        (float16 loss scaling skips an update with non-finite gradients).
    """


def device_function(tower_device: str, variable_device: str) -> Callable:
  """Places variables on `variable_device`, every other op on the tower's.

  Devices already set by an inner `tf.device` win field by field, as with
  `tf.compat.v1.train.replica_device_setter`.
  """
  tower_spec = tf.DeviceSpec.from_string(tower_device)
  variable_spec = tf.DeviceSpec.from_string(variable_device)

  def choose(op) -> str:
    op_type = op.type if isinstance(op, tf.Operation) else op.op  # NodeDef.
    spec = variable_spec if op_type in dataflow.STATE_HOLDERS else tower_spec
    current = tf.DeviceSpec.from_string(op.device or "")
    return spec.make_merged_spec(current).to_string()

  return choose


def applied_if(apply_if: Optional[tf.Tensor], apply: Callable[[], Any],
               name: str = "apply_if_finite") -> Any:
  """`apply()`, or, with `apply_if`, a `tf.cond` that runs it only then.

  `MixedPrecisionLossScaleOptimizer`'s pattern: v1 optimizers create their
  slots outside the cond (`init_scope`).
  """
  if apply_if is None:
    return apply()
  return tf.cond(apply_if, lambda: tf.group(apply()), tf.no_op, name=name)


def check_call_counts(towers: list) -> None:
  counts = [len(tower.optimizer_calls) for tower in towers]
  if len(set(counts)) > 1:
    raise ValueError(
        "Towers called `TowerOptimizer.apply_gradients` (or `minimize`) "
        f"different numbers of times: {counts} (tower 0 first). The model_fn "
        "must make the same optimizer calls, in the same order, in every tower.")


def calls_by_position(towers: list) -> list:
  """Per optimizer call (call order), every tower's recorded call."""
  check_call_counts(towers)
  by_position = [[tower.optimizer_calls[position] for tower in towers]
                 for position in range(len(towers[0].optimizer_calls))]
  for calls in by_position:
    warn_if_transformed_differently(calls)
  return by_position


def warn_if_transformed_differently(calls: list) -> None:
  """A WARNING naming the variables whose gradient a tower 1.. transformed
  differently from tower 0 (e.g. a multiplier keyed by tower 0's variable
  object or name that the tower's own copy does not match)."""
  first = calls[0]
  for index, call in enumerate(calls[1:], start=1):
    if first.signature is None or call.signature is None:
      continue
    differ = [v.op.name for (_, v), a, b in zip(
        first.grads_and_vars, first.signature, call.signature) if a != b]
    if differ:
      warn_once.warn(
          f"transformed_differently:{differ}",
          "multi_gpu: tower %d transformed the gradients of %s differently "
          "from tower 0 (ops %s vs %s), so the towers' gradients do not "
          "combine into one device's. Choose multipliers and transforms by "
          "the variables `compute_gradients` returns (tower 0's in every "
          "tower), not by variables or names held per tower.", index,
          ", ".join(differ[:3]), _first_difference(first, call),
          _first_difference(call, first))


def _first_difference(call, other) -> tuple:
  return next((a for a, b in zip(call.signature, other.signature) if a != b),
              ())


def check_variables_line_up(tower_grads: list) -> None:
  """Every tower's (gradient, variable) pairs name the same variables."""
  reference = [v for _, v in tower_grads[0]]
  for index, pairs in enumerate(tower_grads[1:], start=1):
    variables = [v for _, v in pairs]
    if variables != reference:
      only_0 = sorted({v.op.name for v in reference} -
                      {v.op.name for v in variables})
      only_i = sorted({v.op.name for v in variables} -
                      {v.op.name for v in reference})
      logging.error("multi_gpu: tower 0 vs tower %d variables differ: only "
                    "in tower 0: %s; only in tower %d: %s",
                    index, only_0, index, only_i)
      raise ValueError(
          f"Tower {index} computed gradients for different variables than "
          f"tower 0 (only in tower 0: {only_0 or 'none'}; only in tower "
          f"{index}: {only_i or 'none'}; or a different order). Every tower "
          "must call the optimizer on the same variables.")


def warn_no_gradient(tower_grads: list, variables: list) -> None:
  """A WARNING naming the variables no tower has a gradient for."""
  missing = [v.op.name for k, v in enumerate(variables)
             if all(grads[k] is None for grads in tower_grads)]
  if missing:
    warn_once.warn(f"no_gradient:{missing}",
                   "multi_gpu: no gradient for %d variable(s): %s",
                   len(missing), ", ".join(missing))
