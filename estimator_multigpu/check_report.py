"""What `check_towers` found: two training runs compared, and the likely
causes of a mismatch, each with its fix.

`check.py` trains one device and the towers (`Run` each); this module
compares their variables and readouts (`differences`, `within`) and, when
they differ, names the causes it can see in the towers' graph or by a
retry with another option (`causes`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

import numpy as np

from estimator_multigpu import check_readouts

_COUPLED = (
    "the loss divides by a count of the batch (valid tokens, matched "
    "anchors, params['batch_size']) or lets examples see each other "
    "(in-batch negatives, contrastive losses, a global top-k), so each "
    "tower computes it on its shard alone",
    "divide with emg.global_ratio(numerator, count) instead of '/', and "
    "gather what examples share with emg.cross_tower_concat (docs/losses.md: "
    "'Losses over the global batch')")
_GRADIENTS = (
    "the first-step loss agrees but the updates differ: the gradients are "
    "changed per tower (a transform, a random op seeded per tower) before "
    "they are applied",
    "apply TowerOptimizer.compute_gradients' output unchanged; clip with "
    "multi_gpu(clip_gradients_by_norm=...)")


@dataclasses.dataclass
class Run:
  """One training run: variables before and after, its first loss."""
  initial: dict
  final: dict
  first_loss: float
  transformed: list
  readouts: dict = dataclasses.field(default_factory=dict)
  noisy: list = dataclasses.field(default_factory=list)
  state: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TowerCheck:
  """What `check_towers` found.

  Attributes:
    ok: every shared variable, and everything the user reads, agrees
      within the tolerance.
    worst: (name, max abs difference), largest first; a name is a
      variable, `eval/<metric>`, `predict/<key>`, `summary/<tag>` or
      `hook/<Hook>.<key>` (`check_readouts`); one the one device has and
      the towers lack (or hold in another shape) counts as inf.
    devices: the towers' devices.
    steps: training steps compared.
    loss_one_device, loss_towers: the first step's loss of each.
    causes: (likely cause, fix) pairs when not `ok`.
  """
  ok: bool
  worst: list
  devices: list
  steps: int
  loss_one_device: float
  loss_towers: float
  causes: list = dataclasses.field(default_factory=list)

  def __str__(self) -> str:
    where = (f"{len(self.devices)} towers ({', '.join(self.devices)}), "
             f"{self.steps} step{'s' if self.steps > 1 else ''}")
    largest = ", ".join(f"{name} {diff:.2g}" for name, diff in self.worst[:3])
    if self.ok:
      return (f"check_towers: OK: {where}: {len(self.worst)} variables and "
              f"readouts match one device (largest differences: {largest or 'none'}).")
    lines = [f"check_towers: MISMATCH: {where}: the towers differ from one "
             f"device (largest differences: {largest}); first-step loss "
             f"{self.loss_one_device:.6g} on one device, "
             f"{self.loss_towers:.6g} on the towers."]
    lines += [f"Likely cause: {cause}. Fix: {fix}." for cause, fix in
              self.causes]
    return "\n".join(lines)


def compare(reference: Run, towers: Run, devices: list, steps: int,
            tolerance: float, options: dict,
            retry: Callable[..., bool]) -> TowerCheck:
  """What one device's run and the towers' show; when they differ, the
  likely causes (`retry(**change)`: the towers are exact with that change
  of `options`, the `multi_gpu` options of the check)."""
  expected = dict(reference.final, **reference.readouts)
  worst = differences(expected, dict(towers.final, **towers.readouts))
  check = TowerCheck(
      within(worst, expected, tolerance) and not towers.noisy, worst,
      devices, steps, reference.first_loss, towers.first_loss)
  if not check.ok:
    differing = beyond(worst, expected, tolerance)
    check.causes = (check_readouts.causes(differing) if not any(
        name in reference.final for name in differing) else
                    causes(reference, towers, options, retry))
  return check


def beyond(worst: list, reference: dict, tolerance: float) -> list:
  return [name for name, diff in worst
          if not within([(name, diff)], reference, tolerance)]


def differences(reference: dict, towers: dict) -> list:
  """(name, max abs difference) for one device's variables, largest first."""
  worst = [(name, _difference(towers[name], value) if name in towers
            else np.inf) for name, value in reference.items()]
  return sorted(worst, key=lambda pair: -pair[1])


def _difference(got, want) -> float:
  """The max abs difference; for strings and booleans (class names a
  prediction returns), 0 if equal, else inf; inf for another shape."""
  got, want = np.asarray(got), np.asarray(want)
  if got.shape != want.shape:
    return np.inf
  if got.dtype.kind in "OSUb" or want.dtype.kind in "OSUb":
    return 0.0 if np.array_equal(got, want) else np.inf
  return float(np.max(np.abs(got - want), initial=0.0))


def within(worst: list, reference: dict, tolerance: float) -> bool:
  return all(diff <= tolerance * max(1.0, _magnitude(reference[name]))
             for name, diff in worst)


def _magnitude(value) -> float:
  value = np.asarray(value)
  if value.dtype.kind in "OSUb":  # strings, booleans: compared by equality.
    return 1.0
  return float(np.max(np.abs(value), initial=0.0))


def causes(reference: Run, towers: Run, options: dict,
           retry: Callable[..., bool]) -> list:
  """The likely causes of a mismatch, each with its fix."""
  causes = []
  if towers.transformed:
    causes.append((
        "the model_fn transforms each tower's gradients before applying "
        f"them (clipping {', '.join(_short(towers.transformed))})",
        "remove the clip from the model_fn and pass multi_gpu(..., "
        "clip_gradients_by_norm=<the same norm>)"))
  causes += _structural_causes(towers)
  if not options.get("sync_batch_norm") and retry(sync_batch_norm=True):
    causes.append((
        "batch norm normalizes each tower's shard with its own statistics",
        "pass multi_gpu(..., sync_batch_norm=True)"))
  if (options.get("loss_reduction", "mean") == "mean" and
      retry(loss_reduction="sum")):
    causes.append((
        "the loss is a sum over the tower's examples, not a mean (rule 2)",
        "pass multi_gpu(..., loss_reduction='sum'), or divide the sum with "
        "emg.global_ratio(total, count)"))
  if not causes:
    same_loss = np.isclose(reference.first_loss, towers.first_loss,
                           rtol=1e-5, atol=1e-6)
    causes.append(_GRADIENTS if same_loss else _COUPLED)
  return causes


def _structural_causes(towers: Run) -> list:
  """Causes found in the towers' graph: per-tower gradient noise, state the
  train_op updates from tower 0's shard."""
  causes = []
  if towers.noisy:
    causes.append((
        "random noise is added to each tower's gradients "
        f"({', '.join(_short(towers.noisy))}), so the combined noise has "
        "less than one device's standard deviation (check_towers holds "
        "random draws fixed, so the values can still agree)",
        "add the noise once, to the combined gradients: an optimizer that "
        "wraps the inner one, inside TowerOptimizer"))
  if towers.state:
    causes.append((
        "the train_op updates state from tower 0's shard only, outside "
        f"UPDATE_OPS ({', '.join(_short(towers.state))}): a statistic of "
        "the batch (moving average, center-loss counts)",
        "compute it over the global batch with emg.cross_tower_sum or "
        "emg.cross_tower_moments, or use a batch-norm layer with "
        "multi_gpu(..., sync_batch_norm=True)"))
  return causes


def _short(names: list) -> list:
  return [re.sub(r"^tower_\d+/", "", name) for name in names[:3]] + (
      ["..."] if len(names) > 3 else [])
