"""What train.py records in the model dir (run_config.json), and what it
says on a resume: one INFO line with the step it resumes from and the
schedule settings that changed.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from absl import logging
import tensorflow as tf

import classifier
from cli import run_setup
from cli import settings as settings_lib
from cli import towers as towers_lib
from cli.model_dir import resume_settings
from cli.model_dir import run_config
import datasets


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


def run_options(settings: settings_lib.TrainSettings) -> dict:
  """The run's options recorded beside the classifier: its `multi_gpu`
  options by flag name (cli/multi_gpu_options.py), and a few more."""
  return {**dataclasses.asdict(settings.multi_gpu),
          "random_seed": settings.run.random_seed,
          "sync_replicas": settings.cluster.sync_replicas,
          "num_epochs_per_decay":
              settings.optimization.num_epochs_per_decay}


def run_record(setup: run_setup.ModelSetup,
               config: classifier.ClassifierConfig, towers: towers_lib.Towers,
               settings: settings_lib.TrainSettings) -> run_config.RunRecord:
  """What run_config.json records for this run (its dataset dir absolute:
  eval.py and a resume may run from another directory)."""
  return run_config.RunRecord(
      classifier=config, image_size=setup.image_size,
      dataset_name=setup.dataset_name,
      dataset_dir=run_config.absolute(setup.dataset_dir),
      preprocessing=datasets.preprocessing(setup.dataset_name),
      max_steps=settings.optimization.max_steps,
      global_batch_size=settings.data.batch_size,
      towers=tuple(towers.devices), options=run_options(settings),
      dataset_split_name=setup.dataset_split_name,
      preprocessing_name=setup.preprocessing_name,
      labels_offset=setup.labels_offset)


def resume_line(record: Optional[run_config.RunRecord],
                config: classifier.ClassifierConfig, model_dir: str,
                step: int, max_steps: int,
                settings: Optional[settings_lib.TrainSettings] = None) -> str:
  """The one INFO line of a resume: where from, to which step, and every
  setting given with another value than the record's (they may change;
  the schedule's with the learning rate before and after)."""
  line = (f"Resuming from {tf.train.latest_checkpoint(model_dir)} (step "
          f"{step} of --max_steps={max_steps}")
  if record is not None and record.max_steps not in (None, max_steps):
    line += f", recorded {record.max_steps}"
  changes = (run_config.schedule_changes(record.classifier, config)
             if record is not None else [])
  others = _other_changes(record, settings, config, changes)
  if not changes:
    return f"{line}){others or '.'}"
  rates = (learning_rate_at(record.classifier, step),
           learning_rate_at(config, step))
  return (f"{line}) {run_config.schedule_change_message(changes, step, rates)}"
          f"{others}")


def _other_changes(record: Optional[run_config.RunRecord],
                   settings: Optional[settings_lib.TrainSettings],
                   config: classifier.ClassifierConfig,
                   schedule: list) -> str:
  """' Changed since the record: ...' for the settings other than the
  schedule's that this run changes ('' for none)."""
  if record is None or settings is None:
    return ""
  found = resume_settings.changed(
      record, settings, config, skip={"max_steps"} | {
          name for name, _, _ in schedule})
  if not found:
    return ""
  what = ", ".join(f"--{name} {old} -> {new}" for name, old, new in found)
  keep = " ".join(f"--{name}={old}" for name, old, _ in found)
  return f" Changed since the record: {what} (to keep them, pass {keep})."


def record_run(setup: run_setup.ModelSetup,
               config: classifier.ClassifierConfig, towers: towers_lib.Towers,
               settings: settings_lib.TrainSettings) -> None:
  """Writes run_config.json in the model_dir; on a resume, one INFO line
  says where it goes on from and what changed in the schedule."""
  model_dir = settings.run.model_dir
  record = run_record(setup, config, towers, settings)
  step = checkpoint_step(model_dir)
  if step is not None:
    logging.info("%s", resume_line(setup.record, config, model_dir, step,
                                   settings.optimization.max_steps, settings))
  logging.info("Run configuration: %s", run_config.write(model_dir, record))
