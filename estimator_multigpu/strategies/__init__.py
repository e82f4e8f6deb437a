"""Variable strategies: where variables live and how gradients are combined.

One registry (`STRATEGIES`) answers which strategies exist and what each
one is; every check of a strategy name goes through it. The plan names the
strategy `choose` picks from the options; the rest of the build talks to it
through `placement`, `sharing_scope`, `combine` and `apply`
(`base.VariableStrategy`):

- `shared.SharedVariables` ("shared"): one copy on the aggregation device,
  gradients summed there, one update.
- `replicated.ReplicatedVariables` ("replicated"): a copy per tower,
  gradients all-reduced (`all_reduce`), every tower applies the same update;
  what it refuses is `replicated_refusals`. TRAIN graphs only.
- `asynchronous.AsyncTowers` ("async", `synchronization="async"`): shared
  variables, every tower applies its own gradient. TRAIN graphs only.

`variable_update="auto"` (the default) is "replicated" with two or more GPU
towers, across the tasks of an all-reduce cluster, or when an all-reduce
option is given; "shared" otherwise.
"""

from __future__ import annotations

from typing import Any

from estimator_multigpu.strategies import asynchronous
from estimator_multigpu.strategies import base
from estimator_multigpu.strategies import replicated
from estimator_multigpu.strategies import shared

VariableStrategy = base.VariableStrategy

# Strategy name -> class(plan); its traits answer every question about it.
STRATEGIES = {cls.name: cls for cls in (shared.SharedVariables,
                                        replicated.ReplicatedVariables,
                                        asynchronous.AsyncTowers)}
AUTO = "auto"
VARIABLE_UPDATES = (AUTO,) + tuple(dict.fromkeys(
    cls.variable_update for cls in STRATEGIES.values()))
"""The values `multi_gpu(variable_update=...)` accepts: `"auto"` (the
default), then each strategy's (`"shared"`, `"replicated"`)."""
SYNCHRONIZATIONS = tuple(dict.fromkeys(
    cls.synchronization for cls in STRATEGIES.values()))


def choose(variable_update: str, synchronization: str, *,
           replicate: bool = False) -> type:
  """The strategy class the options name.

  Args:
    variable_update: one of `VARIABLE_UPDATES`.
    synchronization: one of `SYNCHRONIZATIONS`.
    replicate: what "auto" prefers where both fit (GPU towers, a cluster).

  Raises:
    ValueError: no strategy has both (the message names the clash).
  """
  matches = [cls for cls in STRATEGIES.values()
             if cls.synchronization == synchronization and
             variable_update in (AUTO, cls.variable_update)]
  if not matches:
    fits = [AUTO] + [cls.variable_update for cls in STRATEGIES.values()
                     if cls.synchronization == synchronization]
    raise ValueError(
        f"synchronization={synchronization!r} was given with variable_update="
        f"{variable_update!r}; no strategy does both (with "
        f"{synchronization!r}: variable_update in {fits}). Drop one of the "
        "two.")
  preferred = [cls for cls in matches if cls.copies_per_tower == replicate]
  return (preferred or matches)[0]


def lookup(name: str) -> type:
  """The class registered as `name` (a plan's `strategy`)."""
  return STRATEGIES[name]


def make_strategy(plan: Any, mode: str = "train") -> base.VariableStrategy:
  """The strategy object the plan names; "shared" for EVAL and PREDICT.

  Only training updates variables, so only TRAIN graphs replicate them;
  evaluation and prediction towers read tower 0's variables.
  """
  if mode != "train":
    return shared.SharedVariables(plan)
  return lookup(plan.strategy)(plan)
