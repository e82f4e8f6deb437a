"""What train.py trains, resolved from its settings in one place: the
towers (cli/towers.py), the model and data (cli/run_setup.py), the model_fn's
configuration (cli/flags/optimization.py), the training input and the
Estimators (cli/run_estimator.py), each checked before the model dir is
prepared (cli/cluster_task.py `prepare_task`) but for fine-tuning, which
reads the prepared model dir. The later phases of a run
(cli/model_dir/start.py, train.py) take the `Plan`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import tensorflow as tf

from estimator_multigpu import cluster

import classifier
from cli import cluster_task
from cli import fine_tuning
from cli import run_estimator
from cli import run_setup
from cli import settings as settings_lib
from cli import towers as towers_lib
from cli.flags import advice
from cli.flags import optimization
from cli.model_dir import checkpoints
from cli.model_dir import resume
import datasets

Settings = settings_lib.TrainSettings


class Plan(NamedTuple):
  """What `run` trains: the checked pieces, in the order they are built.
  `restoring` is the one-tower Estimator whose graph the model dir's
  checkpoint must fit (None: a task that does not write the model dir)."""
  towers: towers_lib.Towers
  setup: run_setup.ModelSetup
  config: classifier.ClassifierConfig
  input_fn: object
  estimator: tf.estimator.Estimator
  restoring: Optional[tf.estimator.Estimator]


def plan(task: Optional[cluster.Task], settings: Settings) -> Plan:
  """Resolves the settings for this task; a mistake raises here, before
  training starts (and, but for fine-tuning's, before the model dir is
  prepared)."""
  run = settings.run
  towers = towers_lib.from_settings(settings.towers)
  setup = run_setup.model_setup(run.model_dir, settings.model, settings.data,
                                training=True)
  if task is None or task.is_chief:
    resume.check(run.model_dir, setup)
  config = optimization.classifier_config(
      settings, setup.num_classes, cluster_task.replicas_to_aggregate(
          task, settings.cluster.sync_replicas), setup.model_name, setup)
  advice.check_sync_batch_norm(settings.multi_gpu.sync_batch_norm,
                               setup.model_name)
  if not _trained_already(task, run.model_dir, settings.optimization.max_steps):
    advice.warn_unreached_peak(config, settings.optimization.max_steps)
  schedule = checkpoints.checkpoint_schedule(
      run.save_checkpoints_steps, run.save_checkpoints_secs,
      "save_checkpoints_steps" in run.given)
  towers = cluster_task.prepare_task(task, towers, run.model_dir)
  input_fn = train_input_fn(settings, setup, cluster_task.trainer_number(task))
  config, warm_start = fine_tuning.apply(
      settings.fine_tuning, config, setup.record, run.model_dir, input_fn,
      averaged=bool(settings.multi_gpu.moving_average_decay))
  return Plan(towers, setup, config, input_fn, *run_estimator.estimators(
      settings, task, towers, config, schedule, warm_start))


def _trained_already(task: Optional[cluster.Task], model_dir: str,
                     max_steps: int) -> bool:
  """Whether a local run's model dir is at or past `max_steps`: it trains
  nothing (cli/model_dir/start.py says so), so no advice on its schedule."""
  step = checkpoints.trained_step(model_dir) if task is None else None
  return step is not None and step >= max_steps


def train_input_fn(settings: Settings, setup: run_setup.ModelSetup,
                   trainer: int = 0):
  """The training input of `setup`'s data (`run_setup.model_setup(...,
  training=True)`: its split, preprocessing and labels offset); trainer k
  of a cluster shuffles with random_seed + k."""
  return datasets.make_input_fn(
      setup.dataset_name, setup.dataset_split_name, settings.data.batch_size,
      image_size=setup.image_size, data_dir=setup.dataset_dir,
      num_classes=setup.num_classes, seed=settings.run.random_seed + trainer,
      is_training=True, preprocessing_name=setup.preprocessing_name,
      labels_offset=setup.labels_offset)
