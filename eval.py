"""Evaluates train.py's checkpoints on the held-out split: python eval.py.

--once evaluates the latest checkpoint; otherwise every new checkpoint is
evaluated as it appears (until --timeout_secs without one, or a checkpoint at
--max_steps). The last line printed is `key=value` pairs, e.g.
`accuracy=0.9694 global_step=1500 loss=0.1025 top_5=0.9972`.
"""

from __future__ import annotations

import math
from typing import Optional

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf
import tqdm

import estimator_multigpu as emg
from estimator_multigpu import evaluation

import classifier
import common_flags
import datasets

FLAGS = flags.FLAGS
tf1 = tf.compat.v1

flags.DEFINE_bool("once", False, "Evaluate the latest checkpoint and exit.")
flags.DEFINE_integer("timeout_secs", 600, "Stop after this long without a "
                     "new checkpoint.")
flags.DEFINE_bool("use_ema_weights", True, "Evaluate the moving-average "
                  "weights when the checkpoint has them.")
flags.DEFINE_string("eval_split", "eval", "Split to evaluate.")


class ProgressBarHook(tf1.train.SessionRunHook):
  """A tqdm bar over the eval batches."""

  def __init__(self, total: Optional[int]):
    self._total = total
    self._bar = None

  def after_create_session(self, session, coord):
    self._bar = tqdm.tqdm(total=self._total, desc="eval", unit="batch",
                          leave=False)

  def after_run(self, run_context, run_values):
    self._bar.update(1)

  def end(self, session):
    self._bar.close()


def checkpoint_has_ema(checkpoint: str) -> bool:
  return any(name.endswith("/ExponentialMovingAverage")
             for name, _ in tf.train.list_variables(checkpoint))


def num_eval_batches(dataset_name: str, split: str,
                     batch_size: int) -> Optional[int]:
  if dataset_name != "digits":
    return None
  return math.ceil(len(datasets.load_digits_split(split)[1]) / batch_size)


def build_estimator(towers: common_flags.Towers,
                    config: classifier.ClassifierConfig, model_dir: str,
                    use_ema: bool) -> tf.estimator.Estimator:
  """The classifier on the towers; EMA weights loaded when `use_ema`."""
  model_fn = emg.multi_gpu(classifier.model_fn, devices=towers.devices,
                           ema_decay=0.999 if use_ema else None)  # names only.
  return tf.estimator.Estimator(
      model_fn, params={"classifier": config}, config=tf.estimator.RunConfig(
          model_dir=model_dir, session_config=towers.session_config))


def evaluate(estimator: tf.estimator.Estimator, input_fn, checkpoint: str,
             total_batches: Optional[int]) -> dict:
  return estimator.evaluate(input_fn, checkpoint_path=checkpoint,
                            hooks=[ProgressBarHook(total_batches)])


def main(argv):
  del argv
  towers, num_classes, image_size = common_flags.setup_from_flags()
  config = classifier.ClassifierConfig(model_name=FLAGS.model_name,
                                       num_classes=num_classes)
  input_fn = datasets.make_input_fn(
      FLAGS.dataset_name, FLAGS.eval_split, FLAGS.batch_size,
      image_size=image_size, data_dir=FLAGS.dataset_dir,
      num_classes=num_classes)
  total = num_eval_batches(FLAGS.dataset_name, FLAGS.eval_split,
                           FLAGS.batch_size)

  def evaluate_checkpoint(checkpoint: str) -> dict:
    use_ema = FLAGS.use_ema_weights and checkpoint_has_ema(checkpoint)
    logging.info("Evaluating %s (%s weights)", checkpoint,
                 "moving-average" if use_ema else "raw")
    estimator = build_estimator(towers, config, FLAGS.model_dir, use_ema)
    return evaluate(estimator, input_fn, checkpoint, total)

  metrics = evaluation.evaluate_checkpoints(
      evaluate_checkpoint, FLAGS.model_dir, FLAGS.max_steps,
      FLAGS.timeout_secs, once=FLAGS.once, require_max_steps=False)
  print(evaluation.format_metrics(metrics))


if __name__ == "__main__":
  app.run(main)
