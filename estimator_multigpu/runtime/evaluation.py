"""Evaluating a training run's checkpoints as they appear.

`evaluate_checkpoints` is the one checkpoint loop: eval.py runs it next to
train.py (or `once` on the latest checkpoint), and a cluster's evaluator
task runs it next to the chief. `format_metrics` is the `key=value` line both
print last.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from absl import logging
import numpy as np
import tensorflow as tf

# Evaluates one checkpoint path; returns metrics with a "global_step".
EvaluateFn = Callable[[str], dict]


def checkpoints(model_dir: str, timeout_secs: float,
                once: bool = False) -> Iterable[str]:
  """The latest checkpoint (`once`), else each new one as it appears.

  Raises:
    FileNotFoundError: `once` and `model_dir` holds no checkpoint.
  """
  if not once:
    return tf.train.checkpoints_iterator(model_dir, timeout=timeout_secs)
  latest = tf.train.latest_checkpoint(model_dir)
  if latest is None:
    raise FileNotFoundError(
        f"--model_dir={model_dir} holds no checkpoint; run train.py with the "
        "same --model_dir first.")
  return [latest]


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
