"""Evaluating a training run's checkpoints as they appear.

`evaluate_checkpoints` is the one checkpoint loop: eval.py runs it next to
train.py (or `once` on the newest readable checkpoint), and a cluster's
evaluator task runs it next to the chief. It reads the model dir and never
changes it: checkpoints are found on disk, with or without the `checkpoint`
state file; a newest one that does not read back (truncated, damaged) is
skipped with a WARNING naming it, and one rotated away by a live training
while it is evaluated is replaced by the newest one. `format_metrics` is the `key=value` line both
print last.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, Optional

from absl import logging
import numpy as np
import tensorflow as tf

from estimator_multigpu.runtime import checkpoints as checkpoints_lib

__all__ = ["CheckpointWatch", "evaluate_checkpoints", "evaluate_present",
           "format_metrics"]

# Evaluates one checkpoint path; returns metrics with a "global_step".
EvaluateFn = Callable[[str], dict]
REPORT_EVERY_SECS = 60.0  # while waiting for a checkpoint, a line this often.
POLL_SECS = 1.0  # how often the model dir is looked at while waiting.


class CheckpointWatch:
  """The checkpoints to evaluate: the newest readable one (`once`), else
  each new one as it appears, found on disk (with or without the state
  file); unreadable ones are skipped with a WARNING
  (`checkpoints_lib.newest_readable`).

  Attributes:
    last_step: the step of the newest checkpoint handed out.
    skipped: prefixes found unreadable.
  """

  def __init__(self, model_dir: str, timeout_secs: float):
    self.model_dir, self.timeout_secs = model_dir, timeout_secs
    self.last_step, self.skipped = -1, set()

  def newest(self) -> Optional[str]:
    """The newest readable checkpoint past `last_step` (None: none)."""
    found = checkpoints_lib.newest_readable(self.model_dir, self.last_step,
                                            self.skipped)
    if found is None:
      return None
    self.last_step = found.step
    return found.prefix

  def latest(self) -> str:
    """The newest readable checkpoint.

    Raises:
      FileNotFoundError: there is none.
    """
    latest = self.newest()
    if latest is None:
      raise FileNotFoundError(
          f"--model_dir={self.model_dir} holds no {self._readable()}"
          "checkpoint; run train.py with the same --model_dir first.")
    return latest

  def _readable(self) -> str:
    return "readable " if self.skipped else ""

  def new_checkpoints(self) -> Iterator[str]:
    """Each new checkpoint, saying at once and every `REPORT_EVERY_SECS`
    while none has appeared yet that it waits, and for what."""
    if not checkpoints_lib.finished_checkpoints(self.model_dir):
      logging.warning("--model_dir=%s %s; waiting up to %g s for train.py "
                      "to write a checkpoint there (misspelt? --timeout_secs "
                      "sets the wait).", self.model_dir,
                      _no_run(self.model_dir), self.timeout_secs)
    waited = _Waited(self.model_dir, self.timeout_secs)
    while True:
      checkpoint = self._wait(min(REPORT_EVERY_SECS, self.timeout_secs))
      if checkpoint is None:
        if waited.report():
          return
        continue
      waited.seen, waited.secs = checkpoint, 0.0
      yield checkpoint

  def _wait(self, secs: float) -> Optional[str]:
    """A new checkpoint within `secs` (None: none appeared)."""
    deadline = time.monotonic() + secs
    while True:
      checkpoint = self.newest()
      if checkpoint is not None or time.monotonic() + POLL_SECS > deadline:
        return checkpoint
      time.sleep(POLL_SECS)


def _no_run(model_dir: str) -> str:
  if not tf.io.gfile.isdir(model_dir):
    return "does not exist (no run has written there)"
  return "holds no checkpoint yet (no run has saved there)"


class _Waited:
  """The wait for a new checkpoint: logs it; `report` is True to stop."""

  def __init__(self, model_dir: str, timeout_secs: float):
    self.model_dir, self.timeout_secs = model_dir, timeout_secs
    self.secs, self.seen = 0.0, None

  def report(self) -> bool:
    self.secs += min(REPORT_EVERY_SECS, self.timeout_secs)
    if self.secs >= self.timeout_secs:
      return True
    after = f"after {self.seen}" if self.seen else "(none so far)"
    log = logging.info if self.seen else logging.warning
    log("Still waiting for a new checkpoint in %s %s: %.0f s of "
        "--timeout_secs=%g.", self.model_dir, after, self.secs,
        self.timeout_secs)
    return False


def evaluate_present(evaluate_fn: EvaluateFn, checkpoint: str,
                     watch: CheckpointWatch) -> tuple:
  """(checkpoint, `evaluate_fn(checkpoint)`); when the checkpoint is removed
  before it is read (a live training keeps only its newest ones), the
  newest readable one instead, with a WARNING. Each retry takes a newer
  step, so the retries end with the training's saves.

  Raises:
    tf.errors.OpError, ValueError: evaluating failed with the checkpoint
      still there, or with no newer readable one.
  """
  while True:
    try:
      return checkpoint, evaluate_fn(checkpoint)
    except (tf.errors.OpError, ValueError):  # ValueError: Saver.restore's
      # "not a valid checkpoint", for one removed between its checks.
      if tf.io.gfile.exists(checkpoint + ".index"):
        raise
      newest = watch.newest()
      if newest is None:
        raise
      logging.warning("Checkpoint %s was removed before it could be read (a "
                      "training keeps only its newest checkpoints); "
                      "evaluating the newest one, %s, instead.", checkpoint,
                      newest)
      checkpoint = newest


def evaluate_checkpoints(evaluate_fn: EvaluateFn, model_dir: str,
                         max_steps: Optional[int], timeout_secs: float,
                         once: bool = False,
                         require_max_steps: bool = True) -> dict:
  """Evaluates each new checkpoint until one is at or past `max_steps`.

  Checkpoints are found on disk (a missing state file is no matter); one
  that does not read back is skipped with a WARNING for the newest that
  does, and one removed while it is evaluated (rotated away by a live
  training) is replaced by the newest one.

  Args:
    evaluate_fn: evaluates one checkpoint path, e.g.
      `lambda path: estimator.evaluate(input_fn, checkpoint_path=path)`.
    model_dir: where the checkpoints appear.
    max_steps: stop after a checkpoint at or past this global step (or
      after the newest readable one, when one at or past it cannot be
      read); None or 0: stop only after `timeout_secs` without a new one.
    timeout_secs: how long to wait for a new checkpoint.
    once: evaluate the newest readable checkpoint only.
    require_max_steps: whether stopping on the timeout before a checkpoint
      at `max_steps` is an error (a cluster evaluator whose chief stopped);
      False: it ends the loop like reaching `max_steps`.

  Returns:
    The metrics of the last checkpoint evaluated.

  Raises:
    FileNotFoundError: `once` and no readable checkpoint.
    TimeoutError: no checkpoint at all appeared within `timeout_secs`, or,
      with `require_max_steps`, none at or past `max_steps` did before a
      wait of `timeout_secs` without a new one.
  """
  watch = CheckpointWatch(model_dir, timeout_secs)
  metrics = None
  for checkpoint in [watch.latest()] if once else watch.new_checkpoints():
    checkpoint, metrics = evaluate_present(evaluate_fn, checkpoint, watch)
    logging.info("Evaluated %s: %s", checkpoint, format_metrics(metrics))
    if max_steps and (metrics["global_step"] >= max_steps or
                      _skipped_last(watch, max_steps)):
      return metrics
  if once or (metrics is not None and not (max_steps and require_max_steps)):
    return metrics
  last = "none" if metrics is None else f"step {metrics['global_step']}"
  target = f"; waiting for step {max_steps}" if max_steps else ""
  raise TimeoutError(
      f"No new checkpoint appeared in {model_dir} for {timeout_secs:g} s "
      f"(last evaluated: {last}{target}). Check that training is running "
      "and writes to this model_dir, or wait longer.")


def _skipped_last(watch: CheckpointWatch, max_steps: int) -> bool:
  """Whether the checkpoint at or past `max_steps` was skipped as
  unreadable: the training has ended, nothing newer will come."""
  return any(checkpoints_lib.step_of(prefix) >= max_steps
             for prefix in watch.skipped)


def format_metrics(metrics: dict) -> str:
  """`key=value` pairs sorted by key; floats with 4 decimals."""
  def text(value):
    floating = np.issubdtype(np.asarray(value).dtype, np.floating)
    return f"{value:.4f}" if floating else str(value)
  return " ".join(f"{key}={text(value)}"
                  for key, value in sorted(metrics.items()))
