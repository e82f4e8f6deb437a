"""Variable strategies: where variables live and how gradients are combined.

The plan names the strategy (`multi_gpu(variable_update=...)`); the rest of
the build talks to it through `placement`, `sharing_scope`, `combine` and
`apply` (`base.VariableStrategy`):

- `shared.SharedVariables` ("shared"): one copy on the aggregation device,
  gradients summed there, one update.
- `replicated.ReplicatedVariables` ("replicated"): a copy per tower,
  gradients all-reduced (`allreduce`), every tower applies the same update.
  TRAIN graphs only.
- `asynchronous.AsyncTowers` (`synchronization="async"`): shared variables,
  every tower applies its own gradient. TRAIN graphs only.
"""

from __future__ import annotations

from typing import Any

from estimator_multigpu.strategies import asynchronous
from estimator_multigpu.strategies import base
from estimator_multigpu.strategies import replicated
from estimator_multigpu.strategies import shared

VariableStrategy = base.VariableStrategy

# Strategy name -> class(plan).
STRATEGIES = {shared.SharedVariables.name: shared.SharedVariables,
              replicated.ReplicatedVariables.name:
                  replicated.ReplicatedVariables}


def make_strategy(plan: Any, mode: str = "train") -> base.VariableStrategy:
  """The strategy object the plan names; "shared" for EVAL and PREDICT.

  Only training updates variables, so only TRAIN graphs replicate them;
  evaluation and prediction towers read tower 0's variables.
  """
  if mode != "train":
    return shared.SharedVariables(plan)
  if plan.synchronization == "async":
    return asynchronous.AsyncTowers(plan)
  return STRATEGIES[plan.variable_update](plan)
