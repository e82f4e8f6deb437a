"""Evaluating a training run's checkpoints as they appear.

`evaluate_checkpoints` is the one checkpoint loop: eval.py runs it next to
train.py (or `once` on the latest checkpoint), and a cluster's evaluator
task runs it next to the chief. `format_metrics` is the `key=value` line both
print last.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Optional

from absl import logging
import numpy as np
import tensorflow as tf

# Evaluates one checkpoint path; returns metrics with a "global_step".
EvaluateFn = Callable[[str], dict]
REPORT_EVERY_SECS = 60.0  # while waiting for a checkpoint, a line this often.


def checkpoints(model_dir: str, timeout_secs: float,
                once: bool = False) -> Iterable[str]:
  """The latest checkpoint (`once`), else each new one as it appears.

  Raises:
    FileNotFoundError: `once` and `model_dir` holds no checkpoint.
  """
  if not once:
    return _new_checkpoints(model_dir, timeout_secs)
  latest = tf.train.latest_checkpoint(model_dir)
  if latest is None:
    raise FileNotFoundError(
        f"--model_dir={model_dir} holds no checkpoint; run train.py with the "
        "same --model_dir first.")
  return [latest]


def _new_checkpoints(model_dir: str, timeout_secs: float) -> Iterator[str]:
  """Each new checkpoint, saying at once and every `REPORT_EVERY_SECS`
  while none has appeared yet that it waits, and for what."""
  if tf.train.latest_checkpoint(model_dir) is None:
    logging.warning("--model_dir=%s %s; waiting up to %g s for train.py to "
                    "write a checkpoint there (misspelt? --timeout_secs "
                    "sets the wait).", model_dir, _no_run(model_dir),
                    timeout_secs)
  waited = _Waited(model_dir, timeout_secs)
  for checkpoint in tf.train.checkpoints_iterator(
      model_dir, timeout=min(REPORT_EVERY_SECS, timeout_secs),
      timeout_fn=waited.report):
    waited.seen = checkpoint
    waited.secs = 0.0
    yield checkpoint


def _no_run(model_dir: str) -> str:
  if not tf.io.gfile.isdir(model_dir):
    return "does not exist (no run has written there)"
  return "holds no checkpoint yet (no run has saved there)"


class _Waited:
  """`checkpoints_iterator`'s timeout_fn: logs the wait; True to stop."""

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


def evaluate_checkpoints(evaluate_fn: EvaluateFn, model_dir: str,
                         max_steps: Optional[int], timeout_secs: float,
                         once: bool = False,
                         require_max_steps: bool = True) -> dict:
  """Evaluates each new checkpoint until one is at or past `max_steps`.

  Args:
    evaluate_fn: evaluates one checkpoint path, e.g.
      `lambda path: estimator.evaluate(input_fn, checkpoint_path=path)`.
    model_dir: where the checkpoints appear.
    max_steps: stop after a checkpoint at or past this global step; None
      or 0: stop only after `timeout_secs` without a new checkpoint.
    timeout_secs: how long to wait for a new checkpoint.
    once: evaluate the latest checkpoint only.
    require_max_steps: whether stopping on the timeout before a checkpoint
      at `max_steps` is an error (a cluster evaluator whose chief stopped);
      False: it ends the loop like reaching `max_steps`.

  Returns:
    The metrics of the last checkpoint evaluated.

  Raises:
    FileNotFoundError: `once` and no checkpoint.
    TimeoutError: no checkpoint at all appeared within `timeout_secs`, or,
      with `require_max_steps`, none at or past `max_steps` did before a
      wait of `timeout_secs` without a new one.
  """
  metrics = None
  for checkpoint in checkpoints(model_dir, timeout_secs, once):
    metrics = evaluate_fn(checkpoint)
    logging.info("Evaluated %s: %s", checkpoint, metrics)
    if max_steps and metrics["global_step"] >= max_steps:
      return metrics
  if once or (metrics is not None and not (max_steps and require_max_steps)):
    return metrics
  last = "none" if metrics is None else f"step {metrics['global_step']}"
  target = f"; waiting for step {max_steps}" if max_steps else ""
  raise TimeoutError(
      f"No new checkpoint appeared in {model_dir} for {timeout_secs:g} s "
      f"(last evaluated: {last}{target}). Check that training is running "
      "and writes to this model_dir, or wait longer.")


def format_metrics(metrics: dict) -> str:
  """`key=value` pairs sorted by key; floats with 4 decimals."""
  def text(value):
    floating = np.issubdtype(np.asarray(value).dtype, np.floating)
    return f"{value:.4f}" if floating else str(value)
  return " ".join(f"{key}={text(value)}"
                  for key, value in sorted(metrics.items()))
