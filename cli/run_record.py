"""What train.py records in the model dir (run_config.json), and what it
says on a resume: the step it resumes from, and a schedule that changed.
"""

from __future__ import annotations

from typing import Optional

from absl import flags
from absl import logging
import tensorflow as tf

import classifier
from cli import common_flags
from cli import run_config
from cli import train_data_flags
import datasets

FLAGS = flags.FLAGS


def flag_value(name: str, default=None):
  """A flag's value, or `default` when this checkout does not define it."""
  return FLAGS[name].value if name in FLAGS else default


def checkpoint_step(model_dir: str) -> Optional[int]:
  """The global step of the model_dir's latest checkpoint; None: none."""
  latest = tf.train.latest_checkpoint(model_dir)
  return int(latest.rsplit("-", 1)[1]) if latest else None


def learning_rate_at(config: classifier.ClassifierConfig, step: int) -> float:
  """The schedule's learning rate at `step` (evaluated in a scratch graph)."""
  with tf.Graph().as_default():
    rate = classifier.learning_rate(config, tf.constant(step, tf.int64))
    with tf.compat.v1.Session() as session:
      return float(session.run(rate))


def run_record(setup: common_flags.ModelSetup,
               config: classifier.ClassifierConfig,
               towers: common_flags.Towers) -> run_config.RunRecord:
  """What run_config.json records for this run."""
  data = train_data_flags.train_data(setup)
  options = {name: flag_value(name) for name in (
      "moving_average_decay", "clip_gradients_by_norm", "random_seed",
      "sync_replicas", "variable_update", "sync_batch_norm",
      "accumulate_steps", "mixed_precision", "num_epochs_per_decay")
      if name in FLAGS}
  return run_config.RunRecord(
      classifier=config, image_size=setup.image_size,
      dataset_name=setup.dataset_name, dataset_dir=setup.dataset_dir,
      preprocessing=datasets.preprocessing(setup.dataset_name),
      max_steps=FLAGS.max_steps, global_batch_size=FLAGS.batch_size,
      towers=tuple(towers.devices), options=options,
      dataset_split_name=data["split"],
      preprocessing_name=data["preprocessing_name"],
      labels_offset=data["labels_offset"])


def record_run(setup: common_flags.ModelSetup,
               config: classifier.ClassifierConfig,
               towers: common_flags.Towers, model_dir: str) -> None:
  """Writes run_config.json; on a resume, says if the schedule changed."""
  step = checkpoint_step(model_dir)
  if step is not None and setup.record is not None:
    changes = run_config.schedule_changes(setup.record.classifier, config)
    if changes:
      rates = (learning_rate_at(setup.record.classifier, step),
               learning_rate_at(config, step))
      logging.warning(run_config.schedule_change_message(
          changes, step, model_dir, rates))
  if step is not None:
    logging.info("Resuming from %s (step %d of %d)",
                 tf.train.latest_checkpoint(model_dir), step, FLAGS.max_steps)
  logging.info("Run configuration: %s", run_config.write(
      model_dir, run_record(setup, config, towers)))


