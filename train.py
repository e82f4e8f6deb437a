"""Trains a nets/ classifier on N towers: python train.py [--flags].

With no flags it trains LeNet on the built-in digits (scikit-learn's 8x8
handwritten digits) on every GPU, or on 2 virtual CPU towers without GPUs.
It resumes from the newest usable checkpoint in --model_dir (rebuilding a
missing or garbled `checkpoint` state file, skipping a corrupt newest
checkpoint with a WARNING, removing leftovers of interrupted saves). SIGTERM
or Ctrl-C stops it after the current step with a final checkpoint (exit
status 128 + signal); a NaN or Inf loss or variable stops it with an error
naming the step and the newest checkpoint, which holds no NaN: every save is
checked first.

On a cluster (docs/distributed.md) every task runs this script with the same
--ps_hosts and --worker_hosts plus its own --job_name (ps, worker, evaluator)
and --task_index (worker 0 is the chief), or with a TF_CONFIG environment
variable instead of those flags. --sync_replicas averages one gradient from
each worker per step; without it the workers update asynchronously.

The run's configuration (net, classes, image size, preprocessing, schedule,
towers, options) is written to --model_dir/run_config.json, so eval.py and
export.py need only --model_dir; a resume takes the net and data from it
and refuses other ones (a schedule may change).
Fine-tuning uses tf-slim's flags (cli/fine_tuning.py): --checkpoint_path
starts a new --model_dir from another run's checkpoint, without the
--checkpoint_exclude_scopes, training only --trainable_scopes.
Logs are quiet by default (progress lines with an ETA); --verbosity=1 shows
TensorFlow's own lines too.
"""

from __future__ import annotations

import os
import sys
from typing import NamedTuple, Optional

from cli import entry_point  # first: a missing package is one line.
from cli import script_logging

script_logging.before_tensorflow()  # C++ log level: before TensorFlow.

# pylint: disable=g-import-not-at-top,wrong-import-position,g-bad-import-order
from absl import flags
from absl import logging
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu import cluster
from estimator_multigpu.runtime import evaluation
from estimator_multigpu.runtime import guards
from estimator_multigpu.runtime import hooks
from estimator_multigpu.runtime import scaling
from estimator_multigpu.cluster import all_reduce_training
from estimator_multigpu.cluster import job_control

import classifier
import datasets
from cli import cluster_task
from cli import fine_tuning
from cli.flags import definitions as cli_flags
from cli.flags import optimization as optimization_flags
from cli.flags import advice
from cli import run_setup
from cli import settings as settings_lib
from cli.model_dir import checkpoints
from cli.model_dir import restore_check
from cli.model_dir import resume
from cli.model_dir import run_record
from cli.model_dir import run_settings
from cli.model_dir import train_checks

FLAGS = flags.FLAGS
FLAG_GROUPS = (cli_flags.shared, cli_flags.training, cli_flags.fine_tuning,
               cli_flags.cluster)
cli_flags.define(*FLAG_GROUPS, data_checks=True)
Settings = settings_lib.TrainSettings
NOTHING_LEFT = -1  # `train`: an all-reduce job's chief was at --max_steps.


def classifier_config(settings: Settings, num_classes: int,
                      sync_replicas: int = 0,
                      model_name: Optional[str] = None,
                      setup: Optional[run_setup.ModelSetup] = None
                      ) -> classifier.ClassifierConfig:
  """The model_fn's configuration (`model_name`: the net, default the
  settings'; `setup`: the data, default the settings')."""
  opt = settings.optimization
  decay_steps = opt.decay_steps or max(opt.max_steps - opt.warmup_steps, 1)
  slim = optimization_flags.classifier_settings(
      opt, settings.optimizer,
      lambda: run_setup.epoch_size(settings.data, setup),
      settings.data.batch_size * settings.multi_gpu.accumulate_steps *
      max(sync_replicas, 1))
  return classifier.ClassifierConfig(
      model_name=model_name or settings.model.model_name,
      num_classes=num_classes, weight_decay=opt.weight_decay,
      label_smoothing=opt.label_smoothing, optimizer=opt.optimizer,
      learning_rate=opt.learning_rate, momentum=opt.momentum,
      learning_rate_decay_type=opt.learning_rate_decay_type,
      end_learning_rate=opt.end_learning_rate,
      warmup_steps=opt.warmup_steps, sync_replicas=sync_replicas,
      **{"decay_steps": decay_steps, **slim})


def build_model_fn(towers: run_setup.Towers, ema_decay, clip_norm,
                   global_batch_size: int, max_steps: int,
                   log_every_n_steps: int, model_dir: Optional[str],
                   trainers: int = 1, sync_replicas: bool = False,
                   scaling_report: bool = True,
                   variable_update: str = "auto",
                   sync_batch_norm: bool = False, accumulate_steps: int = 1,
                   mixed_precision: Optional[str] = None):
  """The classifier model_fn on the towers, with progress (and scaling) hooks.

  The hook writes throughput summaries to `model_dir` (None: only logs). On
  a cluster of `trainers` workers it reports the whole cluster's examples
  per second: a global step is one worker's batch, or with `sync_replicas`
  one batch from each worker (times `accumulate_steps` batches per update).
  When the training graph has batch norm and the per-tower batch is small
  (without `sync_batch_norm`), it warns.
  """
  wrapped = emg.multi_gpu(classifier.model_fn, devices=towers.devices,
                          ema_decay=ema_decay,
                          clip_gradients_by_norm=clip_norm,
                          variable_update=variable_update,
                          accumulate_steps=accumulate_steps,
                          mixed_precision=mixed_precision,
                          sync_batch_norm=sync_batch_norm)
  examples_per_step = global_batch_size * accumulate_steps * (
      trainers if sync_replicas else 1)

  num_towers = len(towers.devices) * trainers

  def progress(spec):
    advice.warn_small_batch_norm(tf.compat.v1.get_default_graph(),
                                     global_batch_size, len(towers.devices),
                                     sync_batch_norm)
    progress_hook = hooks.ProgressHook(spec.loss, examples_per_step,
                                       num_towers, max_steps,
                                       log_every_n_steps, model_dir)
    if not scaling_report:
      return [progress_hook]
    return [progress_hook, scaling.ScalingReportHook(
        progress_hook, report_level=logging.DEBUG, repeat_warnings=False)]

  return hooks.with_training_hooks(wrapped, progress)


def build_estimator(model_fn, config: classifier.ClassifierConfig,
                    towers: run_setup.Towers, model_dir: str,
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


def train_input_fn(settings: Settings, setup: run_setup.ModelSetup,
                   trainer: int = 0):
  """The training input of `setup`'s data: the split, augmentation and
  labels offset of `run_setup.train_data`; trainer k of a cluster shuffles
  with random_seed + k."""
  data = run_setup.train_data(settings.data, setup)
  return datasets.make_input_fn(
      setup.dataset_name, data["split"], settings.data.batch_size,
      image_size=setup.image_size, data_dir=setup.dataset_dir,
      num_classes=setup.num_classes, seed=settings.run.random_seed + trainer,
      is_training=True, preprocessing_name=data["preprocessing_name"],
      labels_offset=data["labels_offset"])


def log_every_n_steps(flag_value: Optional[int], max_steps: int) -> int:
  """--log_every_n_steps, else a tenth of the run (1..100 steps)."""
  if flag_value:
    return flag_value
  return max(1, min(100, max_steps // 10))


def make_estimator(settings: Settings, task: Optional[cluster.Task],
                   towers: run_setup.Towers,
                   config: classifier.ClassifierConfig, schedule: tuple,
                   warm_start_from=None) -> tf.estimator.Estimator:
  """The classifier Estimator for this task (summaries: chief/local only)."""
  run, wrap = settings.run, settings.multi_gpu
  max_steps = settings.optimization.max_steps
  model_fn = build_model_fn(
      towers, wrap.moving_average_decay, wrap.clip_gradients_by_norm,
      settings.data.batch_size, max_steps,
      log_every_n_steps(run.log_every_n_steps, max_steps),
      run.model_dir if task is None or task.is_chief else None,
      len(task.trainers) if task else 1, settings.cluster.sync_replicas,
      run.scaling_report, variable_update=wrap.variable_update,
      sync_batch_norm=wrap.sync_batch_norm,
      accumulate_steps=wrap.accumulate_steps,
      mixed_precision=wrap.mixed_precision)
  steps, secs = schedule
  return build_estimator(model_fn, config, towers, run.model_dir, steps,
                         run.save_summary_steps, run.random_seed, secs,
                         warm_start_from)


def train(settings: Settings, estimator: tf.estimator.Estimator,
          task: Optional[cluster.Task], towers: run_setup.Towers, input_fn,
          setup: run_setup.ModelSetup) -> Optional[int]:
  """Trains here or as a cluster trainer; returns the stopping signal
  (NOTHING_LEFT: an all-reduce job had nothing left to train)."""
  model_dir, max_steps = settings.run.model_dir, settings.optimization.max_steps
  logging.info("Training %s on %s: global batch %d over %d towers to step "
               "%d -> %s", setup.model_name, setup.dataset_name,
               settings.data.batch_size, len(towers.devices), max_steps,
               model_dir)
  logging.info("Building the training graph of %s on %d tower(s)%s; the "
               "first progress line follows its first step.",
               setup.model_name, len(towers.devices),
               " with synchronized batch norm"
               if settings.multi_gpu.sync_batch_norm else "")
  with guards.SignalStop(blocked_secs=settings.run.stop_grace_secs,
                        on_blocked=_on_blocked(task)) as stop:
    def train_with(extra_hooks):
      estimator.train(
          input_fn, max_steps=max_steps,
          hooks=[guards.NonFiniteLossHook(model_dir), stop.hook(),
                 *extra_hooks],
          saving_listeners=[guards.FiniteCheckpointListener(model_dir)])
      return True
    if task is None:
      train_with([])
    elif task.all_reduce:
      if not all_reduce_training.run_task(
          estimator, train_with, settings.cluster.peer_timeout_secs,
          **_all_reduce_options(settings, task, towers, estimator),
          stop_received=lambda: stop.received):
        return NOTHING_LEFT
    else:
      job_control.run_trainer(task, train_with,
                              sync_replicas=settings.cluster.sync_replicas,
                              base_config=towers.session_config,
                              ps_wait_secs=settings.cluster.ps_wait_secs,
                              stop_requested=lambda: stop.received is not None)
  return stop.received


def _on_blocked(task: Optional[cluster.Task]):
  """What a stop signal whose step does not end within the grace does."""
  if task is None:
    return None
  if task.all_reduce:
    return all_reduce_training.abandon
  return lambda number, secs: job_control.abandon(task, number, secs)


def _all_reduce_options(settings: Settings, task: cluster.Task,
                        towers: run_setup.Towers,
                        estimator: tf.estimator.Estimator) -> dict:
  """`run_task`'s options for train.py: the settings every task must share
  (cli/model_dir/run_settings.py), the tasks' names as started, the grace
  time."""
  shared = run_settings.across_tasks(
      settings, estimator.params["classifier"], len(towers.devices))
  return dict(max_steps=settings.optimization.max_steps,
              names=cluster_task.task_names(
                  task, settings.cluster.worker_hosts is not None),
              settings=shared, grace_secs=settings.run.stop_grace_secs)


def evaluate(settings: Settings, estimator: tf.estimator.Estimator,
             setup: run_setup.ModelSetup) -> None:
  """The evaluator task: each new checkpoint of the chief, to max_steps."""
  input_fn = datasets.make_input_fn(
      setup.dataset_name, "eval", settings.data.batch_size,
      image_size=setup.image_size, data_dir=setup.dataset_dir,
      num_classes=setup.num_classes, labels_offset=setup.labels_offset)
  metrics = evaluation.evaluate_checkpoints(
      lambda path: estimator.evaluate(input_fn, checkpoint_path=path),
      estimator.model_dir, settings.optimization.max_steps,
      settings.cluster.eval_timeout_secs)
  print(evaluation.format_metrics(metrics))


class Plan(NamedTuple):
  """What `run` trains: the checked pieces, in the order they are built."""
  towers: run_setup.Towers
  setup: run_setup.ModelSetup
  config: classifier.ClassifierConfig
  schedule: tuple
  input_fn: object
  warm_start: Optional[tf.estimator.WarmStartSettings]


def plan(task: Optional[cluster.Task], settings: Settings) -> Plan:
  """Resolves the settings for this task; a mistake raises here, before
  anything is written but the model dir's checks."""
  run = settings.run
  towers = run_setup.towers(settings.towers)
  setup = run_setup.model_setup(run.model_dir, settings.model, settings.data)
  if task is None or task.is_chief:
    resume.check(run.model_dir, setup)
  advice.check_sync_batch_norm(settings.multi_gpu.sync_batch_norm,
                               setup.model_name)
  config = classifier_config(settings, setup.num_classes,
                             cluster_task.replicas_to_aggregate(
                                 task, settings.cluster.sync_replicas),
                             setup.model_name, setup)
  advice.warn_unreached_peak(config, settings.optimization.max_steps)
  schedule = checkpoints.checkpoint_schedule(
      run.save_checkpoints_steps, run.save_checkpoints_secs,
      "save_checkpoints_steps" in run.given)
  towers = cluster_task.prepare_task(task, towers, run.model_dir,
                                     run.min_free_disk_mb)
  train_checks.check_batch_of(
      settings.data.batch_size, setup.dataset_name,
      run_setup.train_data(settings.data, setup)["split"], setup.dataset_dir)
  input_fn = train_input_fn(settings, setup, cluster_task.trainer_number(task))
  config, warm_start = fine_tuning.apply(
      settings.fine_tuning, config, setup.record, run.model_dir, input_fn,
      averaged=bool(settings.multi_gpu.moving_average_decay))
  return Plan(towers, setup, config, schedule, input_fn, warm_start)


def check_model_dir(task: Optional[cluster.Task], settings: Settings,
                    planned: Plan) -> bool:
  """The chief's (or a local run's) check that the model_dir's checkpoint
  fits; False when a local run has nothing left to train."""
  if task is not None and not task.is_chief:
    return True
  one_tower = restore_check.one_tower(planned.towers)
  restore_check.check_estimator(
      make_estimator(settings, task, one_tower, planned.config,
                     planned.schedule),
      restore_check.input_specs(planned.input_fn), planned.setup.num_classes)
  return task is not None or not train_checks.nothing_to_train(
      settings.run.model_dir, settings.optimization.max_steps)


def run(task: Optional[cluster.Task], settings: Settings) -> int:
  """Runs this process's part of the job; returns its exit status."""
  if task is not None and task.type == cluster.PS:
    job_control.serve_ps(task, settings.cluster.ps_linger_secs)
    return 0
  with train_checks.writer_lock(task, settings.run.model_dir,
                                settings.run.min_free_disk_mb):
    return run_locked(task, settings)


def run_locked(task: Optional[cluster.Task], settings: Settings) -> int:
  """`run` once this task holds the model dir (a local run, the chief)."""
  planned = plan(task, settings)
  if not check_model_dir(task, settings, planned):
    return 0
  if task is None or task.is_chief:
    run_record.record_run(planned.setup, planned.config, planned.towers,
                          settings)
  if settings.run.check_towers and task is None:
    check_towers(settings, planned)
  estimator = make_estimator(settings, task, planned.towers, planned.config,
                             planned.schedule, planned.warm_start)
  if task is not None and task.type == cluster.EVALUATOR:
    evaluate(settings, estimator, planned.setup)
    return 0
  received = train(settings, estimator, task, planned.towers,
                   planned.input_fn, planned.setup)
  return finish(task, settings, estimator, received)


class TowersMismatchError(RuntimeError):
  """--check_towers: the towers do not train like one device."""


def check_towers(settings: Settings, planned: Plan, steps: int = 2) -> None:
  """--check_towers: one device against the towers, 2 steps, same start.

  Raises:
    TowersMismatchError: they differ; the message names the cause and fix.
  """
  wrap = settings.multi_gpu
  logging.info("Checking that %d towers train %s like one device (%d "
               "steps each)...", len(planned.towers.devices),
               planned.setup.model_name, steps)
  report = emg.check_towers(
      classifier.model_fn, planned.input_fn, planned.towers.devices, steps,
      {"classifier": planned.config}, ema_decay=wrap.moving_average_decay,
      clip_gradients_by_norm=wrap.clip_gradients_by_norm,
      variable_update=wrap.variable_update,
      sync_batch_norm=wrap.sync_batch_norm,
      accumulate_steps=wrap.accumulate_steps,
      mixed_precision=wrap.mixed_precision)
  if not report.ok:
    raise TowersMismatchError(" ".join(str(report).splitlines()))
  logging.info("%s", report)


def finish(task: Optional[cluster.Task], settings: Settings,
           estimator: tf.estimator.Estimator, received: Optional[int]) -> int:
  """The last line of a trainer, and its exit status (128 + signal)."""
  if received == NOTHING_LEFT:  # the line is logged.
    return 0
  if received is None:
    log_done(task, settings)
    return 0
  step = (estimator.get_variable_value("global_step")
          if task is None or task.is_chief else "?")
  logging.warning("Stopped by signal %d at step %s; checkpoint saved in %s",
                  received, step, settings.run.model_dir)
  return 128 + received


def log_done(task: Optional[cluster.Task], settings: Settings) -> None:
  """The last line of a finished trainer; the chief's says what is next."""
  if task is not None and not task.is_chief:
    logging.info("Training done (%s).", task.device)
    return
  model_dir = settings.run.model_dir
  logging.info("Training done: step %d in %s. Next: python eval.py "
               "--model_dir=%s (or export.py --model_dir=%s "
               "--export_dir=...)", settings.optimization.max_steps,
               model_dir, model_dir, model_dir)


def run_cluster_task(task: cluster.Task, settings: Settings) -> int:
  """`run(task, settings)`; an error is one line (cli/entry_point.py) and its
  status."""
  try:
    return run(task, settings)
  except Exception as error:  # pylint: disable=broad-except
    return entry_point.report(error, sys.argv, task.device)


def main(argv):
  del argv
  script_logging.configure(FLAGS.verbosity)
  settings = cli_flags.read(Settings)
  task = cluster_task.cluster_task(settings.cluster,
                                   os.environ.get("TF_CONFIG"))
  if task is None:
    sys.exit(run(None, settings))
  cluster.exit_process(run_cluster_task(task, settings))


if __name__ == "__main__":
  entry_point.run(main, __doc__)
