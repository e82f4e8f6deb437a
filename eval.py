"""Evaluates train.py's checkpoints: python eval.py --model_dir=runs/digits.

The net, classes, image size, data and last step come from the model_dir's
run_config.json (written by train.py); a flag given here overrides the
record, except that --model_name and --num_classes must match it.
--once evaluates the latest checkpoint; otherwise every new checkpoint is
evaluated as it appears, until one at the recorded last step (or
--max_steps), or --timeout_secs without a new one. --checkpoint_path
evaluates exactly that checkpoint (a directory: its latest) once; its
directory is the model_dir unless --model_dir is given. --max_num_batches
evaluates at most that many batches (tf-slim's flag). The last line printed
is `key=value` pairs, e.g.
`accuracy=0.9694 global_step=1500 loss=0.1025 top_5=0.9972`.
"""

from __future__ import annotations

import math
import os
from typing import Optional, Sequence

from absl import flags
from absl import logging

from cli import script_logging

script_logging.before_tensorflow()  # C++ log level: before TensorFlow.

# pylint: disable=g-import-not-at-top,wrong-import-position
import sys

import tensorflow as tf
import tqdm

import estimator_multigpu as emg
from estimator_multigpu.runtime import evaluation
from cli import checkpoint_flags
import classifier
from cli import common_flags
from cli import ema_flags
from cli import data_flags
from cli import errors
from cli import model_dir_check
import datasets
from cli import validators

FLAGS = flags.FLAGS
tf1 = tf.compat.v1

flags.DEFINE_bool("once", False, "Evaluate the latest checkpoint and exit.")
flags.DEFINE_integer("timeout_secs", 600, "Stop after this long without a "
                     "new checkpoint.")
flags.DEFINE_alias("eval_split", "dataset_split_name")  # its earlier name.
flags.DEFINE_integer("max_num_batches", None, "Evaluate at most this many "
                     "batches of --batch_size (default: the whole split).")
flags.register_validator(
    "max_num_batches", lambda value: value is None or value > 0,
    message="expected a number of batches > 0; omit --max_num_batches to "
    "evaluate the whole split.")
validators.register()


class ProgressBarHook(tf1.train.SessionRunHook):
  """A tqdm bar over the eval batches, on its own line of a terminal.

  Not drawn when stderr is not a terminal (a log file, a test): there the
  "Evaluated <checkpoint>" line that follows is the progress.
  """

  def __init__(self, total: Optional[int], show: Optional[bool] = None):
    self._total = total
    self._show = sys.stderr.isatty() if show is None else show
    self._bar = None

  def after_create_session(self, session, coord):
    self._bar = tqdm.tqdm(total=self._total, desc="eval", unit="batch",
                          leave=True, disable=not self._show,
                          file=sys.stderr)

  def after_run(self, run_context, run_values):
    self._bar.update(1)

  def end(self, session):
    self._bar.close()


checkpoint_has_ema = ema_flags.checkpoint_has_ema


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
             total_batches: Optional[int], max_batches: Optional[int] = None,
             hooks: Sequence[tf1.train.SessionRunHook] = ()) -> dict:
  """The metrics of `checkpoint`, over at most `max_batches` (None: all)."""
  if max_batches is not None and total_batches is not None:
    total_batches = min(total_batches, max_batches)
  return estimator.evaluate(
      input_fn, steps=max_batches, checkpoint_path=checkpoint,
      hooks=[ProgressBarHook(total_batches or max_batches), *hooks])


def checkpoint_and_model_dir(checkpoint_path: Optional[str], model_dir: str,
                             model_dir_given: bool) -> tuple:
  """(the checkpoint --checkpoint_path names or None, the model_dir).

  Without --model_dir, the model_dir is the checkpoint's directory (its
  run_config.json; eval summaries go there).

  Raises:
    FileNotFoundError: --checkpoint_path names no checkpoint.
  """
  if not checkpoint_path:
    return None, model_dir
  checkpoint = checkpoint_flags.resolve_checkpoint(checkpoint_path)
  if not model_dir_given:
    model_dir = os.path.dirname(checkpoint) or "."
  return checkpoint, model_dir


def eval_input_fn(setup: common_flags.ModelSetup, split: str,
                  batch_size: int):
  return datasets.make_input_fn(
      setup.dataset_name, split, batch_size, image_size=setup.image_size,
      data_dir=setup.dataset_dir, num_classes=setup.num_classes,
      labels_offset=setup.labels_offset, is_training=False)


def main(argv):
  del argv
  script_logging.configure(FLAGS.verbosity)
  towers = common_flags.towers_from_flags()
  checkpoint, model_dir = checkpoint_and_model_dir(
      FLAGS.checkpoint_path, FLAGS.model_dir, FLAGS["model_dir"].present)
  setup = common_flags.model_setup(model_dir)
  if setup.record is None:
    logging.warning("--model_dir=%s has no run_config.json (train.py writes "
                    "it); using the model and data flags.", model_dir)
  config = setup.classifier_config()
  max_steps = common_flags.recorded_max_steps(setup.record)
  split = data_flags.split_name(data_flags.EVAL_SPLIT)
  input_fn = eval_input_fn(setup, split, FLAGS.batch_size)
  total = num_eval_batches(setup.dataset_name, split, FLAGS.batch_size)

  def evaluate_checkpoint(checkpoint: str) -> dict:
    use_ema = FLAGS.use_ema_weights and checkpoint_has_ema(checkpoint)
    logging.info("Evaluating %s (%s weights)", checkpoint,
                 "moving-average" if use_ema else "raw")
    estimator = build_estimator(towers, config, model_dir, use_ema)
    return evaluate(estimator, input_fn, checkpoint, total,
                    FLAGS.max_num_batches)

  model_dir_check.check_estimator(
      build_estimator(model_dir_check.one_tower(towers), config, model_dir,
                      use_ema=False),
      model_dir_check.input_specs(input_fn), config.num_classes,
      tf.estimator.ModeKeys.EVAL, checkpoint)
  if checkpoint:
    metrics = evaluate_checkpoint(checkpoint)
  else:
    metrics = evaluation.evaluate_checkpoints(
        evaluate_checkpoint, model_dir, max_steps,
        FLAGS.timeout_secs, once=FLAGS.once, require_max_steps=False)
  print(evaluation.format_metrics(metrics))


if __name__ == "__main__":
  errors.run(main, __doc__)
