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
from typing import Callable, Optional

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
  # mode -> why one device could not read it (the mode is not compared).
  not_compared: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class TowerCheck:
  """What `check_towers` found.

  Attributes:
    ok: every shared variable, and everything the user reads, agrees
      within the tolerance, and the towers add no random noise to their
      own gradients.
    worst: (name, max abs difference), largest first. A name is a
      variable, `eval/<metric>`, `predict/<key>`, `summary/<tag>` or
      `hook/<Hook>.<key>` (`check_readouts`); one the one device has and
      the towers lack (or hold in another shape) counts as inf. When a
      variable differs beyond the tolerance, `worst` holds the variables
      only (the verdict leads with the largest of them) and `readouts`
      tells what the user reads.
    readouts: the readouts' (name, max abs difference), largest first.
    devices: the towers' devices.
    steps: training steps compared.
    loss_one_device, loss_towers: the first step's loss of each.
    causes: (likely cause, fix) pairs when not `ok`.
    not_compared: mode ("eval", "predict") -> why one device could not
      build or run it on these inputs, so it is not compared.
    agree: everything compared agrees within the tolerance (not `ok`
      only for per-tower gradient noise, held fixed by the check).
  """
  ok: bool
  worst: list
  devices: list
  steps: int
  loss_one_device: float
  loss_towers: float
  causes: list = dataclasses.field(default_factory=list)
  not_compared: dict = dataclasses.field(default_factory=dict)
  readouts: list = dataclasses.field(default_factory=list)
  agree: bool = False

  def __str__(self) -> str:
    where = (f"{len(self.devices)} towers ({', '.join(self.devices)}), "
             f"{self.steps} step{'s' if self.steps > 1 else ''}")
    largest = ", ".join(f"{name} {diff:.2g}" for name, diff in self.worst[:3])
    skipped = [f"{mode} not compared: one device cannot run it on these "
               f"inputs ({why})" for mode, why in self.not_compared.items()]
    if self.ok:
      return "\n".join([
          f"check_towers: OK: {where}: {len(self.worst)} variables and "
          f"readouts match one device (largest differences: "
          f"{largest or 'none'})."] + skipped)
    verdict = ("the values agree with one device only because check_towers "
               "holds random draws fixed" if self.agree else
               "the towers differ from one device")
    lines = [f"check_towers: MISMATCH: {where}: {verdict} "
             f"(largest differences: {largest}); first-step loss "
             f"{self.loss_one_device:.6g} on one device, "
             f"{self.loss_towers:.6g} on the towers."]
    read = [pair for pair in self.readouts if pair not in self.worst][:3]
    if read:
      lines.append("What the user reads differs too: " + ", ".join(
          f"{name} {diff:.2g}" for name, diff in read) + ".")
    lines += [f"Likely cause: {cause}. Fix: {fix}." for cause, fix in
              self.causes]
    return "\n".join(lines + skipped)


def compare(reference: Run, towers: Run, devices: list, steps: int,
            tolerance: float, options: dict, retry: Callable[..., bool],
            accumulating: Optional[Callable[..., bool]] = None
            ) -> TowerCheck:
  """What one device's run and the towers' show; when they differ, the
  likely causes (`retry(**change)`: the towers are exact with that change
  of `options`, the `multi_gpu` options of the check; `accumulating(
  **change)`, with `accumulate_steps`: they equal one tower accumulating)."""
  expected = dict(reference.final, **reference.readouts)
  worst = differences(expected, dict(towers.final, **towers.readouts))
  differing = beyond(worst, expected, tolerance)
  variables_differ = any(name in reference.final for name in differing)
  check = TowerCheck(
      not differing and not towers.noisy,
      [pair for pair in worst if pair[0] in reference.final or
       not variables_differ], devices, steps, reference.first_loss,
      towers.first_loss, not_compared=dict(reference.not_compared),
      readouts=[pair for pair in worst if pair[0] not in reference.final],
      agree=not differing)
  if not check.ok:
    check.causes = (causes(reference, towers, options, retry, accumulating)
                    if variables_differ else
                    check_readouts.causes(differing) + _noise_causes(towers))
  return check


def first_line(error: BaseException) -> str:
  """`Type: the first line of its message` (a TensorFlow error's op
  traceback left out), at most 200 characters."""
  message = str(getattr(error, "message", "") or error).strip()
  return f"{type(error).__name__}: {message.splitlines()[0] if message else ''}"[:200]


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
           retry: Callable[..., bool],
           accumulating: Optional[Callable[..., bool]] = None) -> list:
  """The likely causes of a mismatch, each with its fix."""
  if accumulating is not None:
    own = _accumulation_causes(options, accumulating)
    if own:
      return own
  causes = []
  if towers.transformed:
    causes.append((
        "the model_fn transforms each tower's gradients before applying "
        f"them (clipping {', '.join(_short(towers.transformed))})",
        "remove the clip from the model_fn and pass multi_gpu(..., "
        "clip_gradients_by_norm=<the same norm>)"))
  causes += _structural_causes(towers)
  if not options.get("sync_batch_norm") and retry(sync_batch_norm=True):
    causes.append(_BATCH_NORM_PER_TOWER)
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


_BATCH_NORM_PER_TOWER = (
    "batch norm normalizes each tower's shard with its own statistics",
    "pass multi_gpu(..., sync_batch_norm=True)")


def _accumulation_causes(options: dict, accumulating: Callable) -> list:
  """With `accumulate_steps`: the towers equal one tower accumulating (with
  synchronized batch norm, if that is what it takes), so what differs from
  one device on the batches concatenated is accumulation's own."""
  if accumulating():
    return [_micro_batches(options["accumulate_steps"])]
  if not options.get("sync_batch_norm") and accumulating(sync_batch_norm=True):
    return [_BATCH_NORM_PER_TOWER,
            _micro_batches(options["accumulate_steps"])]
  return []


def _micro_batches(steps: int) -> tuple:
  return (
      f"with accumulate_steps={steps} every micro-batch is its own batch for "
      "what is computed over the batch (batch norm normalizes each "
      "micro-batch with its own statistics, a loss divided by a count of "
      "the batch divides by the micro-batch's), where this check's "
      f"one-device reference computes it over the {steps} batches "
      "concatenated; the towers train exactly like one device accumulating "
      f"{steps} micro-batches",
      "nothing to fix in the towers; to compare them with one device on the "
      "concatenated batches, check with accumulate_steps=1 (or normalize "
      "without batch statistics: layer or group norm)")


def _structural_causes(towers: Run) -> list:
  """Causes found in the towers' graph: per-tower gradient noise, state the
  train_op updates from tower 0's shard."""
  causes = _noise_causes(towers)
  if towers.state:
    causes.append((
        "the train_op updates state from tower 0's shard only, outside "
        f"UPDATE_OPS ({', '.join(_short(towers.state))}): a statistic of "
        "the batch (moving average, center-loss counts)",
        "compute it over the global batch with emg.cross_tower_sum or "
        "emg.cross_tower_moments, or use a batch-norm layer with "
        "multi_gpu(..., sync_batch_norm=True)"))
  return causes


def _noise_causes(towers: Run) -> list:
  """Per-tower gradient noise, found in the towers' graph (`Run.noisy`)."""
  return [(
      "random noise is added to each tower's gradients "
      f"({', '.join(_short(towers.noisy))}), so the combined noise has "
      "less than one device's standard deviation (check_towers holds "
      "random draws fixed, so the values can still agree)",
      "add the noise once, to the combined gradients: an optimizer that "
      "wraps the inner one, inside TowerOptimizer")] if towers.noisy else []


def _short(names: list) -> list:
  return [re.sub(r"^tower_\d+/", "", name) for name in names[:3]] + (
      ["..."] if len(names) > 3 else [])
