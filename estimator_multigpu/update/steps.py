"""The update chain's steps, in order: the one place that knows the order.

Between the strategy's combine and apply (`update.chain`):

    skip_nonfinite  float16: one apply-or-skip decision for the update, the
                    loss-scale update (`loss_scaling`)
    unscale         float16: ÷ the loss scale (`loss_scaling`)
    accumulate      accumulate_steps=k: + the earlier micro-batches, ÷ their
                    examples (`accumulation`)
    clip            clip_gradients_by_norm: to a global norm, over the
                    global batch (`clipping`)

The decision reads the towers' own (scaled) gradients; accumulation sums
unscaled ones; clipping comes last, on the gradient of the whole accumulated
batch, as one device clips it. A new step (gradient noise, say) is a
`chain.UpdateStep` in its own module and one line here.
"""

from __future__ import annotations

from typing import Any, Optional

from estimator_multigpu.update import accumulation
from estimator_multigpu.update import chain
from estimator_multigpu.update import clipping
from estimator_multigpu.update import loss_scaling as loss_scaling_lib


def steps_for(options: Any, *, device: Optional[str],
              micro_batch_weight: Any = None,
              loss_scaling: Optional[loss_scaling_lib.LossScaling] = None
              ) -> list[chain.UpdateStep]:
  """The chain's steps the options ask for, in order.

  Args:
    options: the decorator's `options.Options` (accumulate_steps,
      loss_reduction, clip_gradients_by_norm).
    device: the aggregation device: the loss scale, the apply-or-skip
      decision and the accumulated loss live there.
    micro_batch_weight: what a micro-batch weighs when accumulating: its
      examples, an int or a scalar tensor
      (`accumulation.micro_batch_weight`).
    loss_scaling: float16's loss scale (the towers scaled by it), or None.

  Returns:
    The `chain.UpdateStep`s, in the order they run.
  """
  accumulate = (accumulation.Accumulate(
      options.accumulate_steps, options.loss_reduction, micro_batch_weight,
      device) if options.accumulate_steps > 1 else None)
  steps: list = []
  if loss_scaling is not None:
    steps += [loss_scaling_lib.SkipNonFinite(loss_scaling, device, accumulate),
              loss_scaling_lib.Unscale(loss_scaling)]
  steps += [accumulate] if accumulate else []
  if options.clip_gradients_by_norm is not None:
    steps.append(clipping.ClipByGlobalNorm(options.clip_gradients_by_norm))
  return steps


def names(steps: list) -> list[str]:
  """The steps' names, in order (for logs and tests)."""
  return [step.name for step in steps]

