"""`--use_ema_weights`, of the scripts that load weights to use them
(eval.py, export.py; train.py keeps averages with --moving_average_decay)."""

from __future__ import annotations

from absl import flags
import tensorflow as tf

flags.DEFINE_bool("use_ema_weights", True, "Use the moving-average weights "
                  "when the checkpoint has them.")


def checkpoint_has_ema(checkpoint: str) -> bool:
  """Whether the checkpoint holds moving averages of the weights."""
  return any(name.endswith("/ExponentialMovingAverage")
             for name, _ in tf.train.list_variables(checkpoint))
