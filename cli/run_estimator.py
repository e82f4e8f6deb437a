"""The Estimator of a planned training run (cli/run_plan.py): the
classifier's model_fn on the towers with its progress (and scaling) hooks,
and the RunConfig that saves its checkpoints and summaries.
"""

from __future__ import annotations

from typing import Optional

from absl import logging
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu import cluster
from estimator_multigpu.runtime import hooks
from estimator_multigpu.runtime import scaling

import classifier
from cli import settings as settings_lib
from cli import towers as towers_lib
from cli.flags import advice
from cli.model_dir import restore_check

Settings = settings_lib.TrainSettings


def build_model_fn(towers: towers_lib.Towers, ema_decay, clip_norm,
                   global_batch_size: int, max_steps: int,
                   log_every_n_steps: int, model_dir: Optional[str],
                   trainers: int = 1, sync_replicas: bool = False,
                   scaling_report: bool = True, **options):
  """The classifier model_fn on the towers, with progress (and scaling) hooks.

  `options` are `multi_gpu`'s other keyword options (train.py's:
  `MultiGpuSettings.options()`, cli/multi_gpu_options.py). The hook writes
  throughput summaries to `model_dir` (None: only logs). On a cluster of
  `trainers` workers it reports the whole cluster's examples per second: a
  global step is one worker's batch, or with `sync_replicas` one batch from
  each worker (times `accumulate_steps` batches per update). When the
  training graph has batch norm and the per-tower batch is small (without
  `sync_batch_norm`), it warns.
  """
  wrapped = emg.multi_gpu(classifier.model_fn, devices=towers.devices,
                          ema_decay=ema_decay,
                          clip_gradients_by_norm=clip_norm, **options)
  examples_per_step = global_batch_size * options.get(
      "accumulate_steps", 1) * (trainers if sync_replicas else 1)
  num_towers = len(towers.devices) * trainers

  def progress(spec):
    advice.warn_small_batch_norm(tf.compat.v1.get_default_graph(),
                                 global_batch_size, len(towers.devices),
                                 options.get("sync_batch_norm", False))
    progress_hook = hooks.ProgressHook(spec.loss, examples_per_step,
                                       num_towers, max_steps,
                                       log_every_n_steps, model_dir)
    if not scaling_report:
      return [progress_hook]
    return [progress_hook, scaling.ScalingReportHook(
        progress_hook, report_level=logging.DEBUG, repeat_warnings=False)]

  return hooks.with_training_hooks(wrapped, progress)


def build_estimator(model_fn, config: classifier.ClassifierConfig,
                    towers: towers_lib.Towers, model_dir: str,
                    save_checkpoints_steps: Optional[int],
                    save_summary_steps: int, random_seed: int,
                    save_checkpoints_secs: Optional[int] = None,
                    warm_start_from=None) -> tf.estimator.Estimator:
  """The Estimator; `warm_start_from`: fine-tuning's WarmStartSettings."""
  run_config = tf.estimator.RunConfig(
      model_dir=model_dir, session_config=towers.session_config,
      save_checkpoints_steps=save_checkpoints_steps,
      save_checkpoints_secs=save_checkpoints_secs,
      save_summary_steps=save_summary_steps, tf_random_seed=random_seed,
      keep_checkpoint_max=5, log_step_count_steps=None)
  return tf.estimator.Estimator(model_fn, config=run_config,
                                params={"classifier": config},
                                warm_start_from=warm_start_from)


def log_every_n_steps(flag_value: Optional[int], max_steps: int) -> int:
  """--log_every_n_steps, else a tenth of the run (1..100 steps)."""
  if flag_value:
    return flag_value
  return max(1, min(100, max_steps // 10))


def make_estimator(settings: Settings, task: Optional[cluster.Task],
                   towers: towers_lib.Towers,
                   config: classifier.ClassifierConfig, schedule: tuple,
                   warm_start_from=None) -> tf.estimator.Estimator:
  """The classifier Estimator for this task (summaries: chief/local only)."""
  run, options = settings.run, settings.multi_gpu.options()
  max_steps = settings.optimization.max_steps
  every = log_every_n_steps(run.log_every_n_steps, max_steps)
  model_fn = build_model_fn(
      towers, options.pop("ema_decay"), options.pop("clip_gradients_by_norm"),
      settings.data.batch_size, max_steps, every,
      run.model_dir if task is None or task.is_chief else None,
      len(task.trainers) if task else 1, settings.cluster.sync_replicas,
      run.scaling_report, **options)
  steps, secs = schedule
  return build_estimator(model_fn, config, towers, run.model_dir, steps,
                         run.save_summary_steps, run.random_seed, secs,
                         warm_start_from)


def estimators(settings: Settings, task: Optional[cluster.Task],
               towers: towers_lib.Towers, config: classifier.ClassifierConfig,
               schedule: tuple, warm_start_from=None) -> tuple:
  """(the Estimator that trains, the one-tower Estimator whose graph the
  model dir's checkpoint must fit: None for a task that does not write the
  model dir)."""
  training = make_estimator(settings, task, towers, config, schedule,
                            warm_start_from)
  if task is not None and not task.is_chief:
    return training, None
  return training, make_estimator(settings, task,
                                  restore_check.one_tower(towers), config,
                                  schedule)
