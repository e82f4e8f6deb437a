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
and refuses other ones, and keeps every other recorded setting (batch size,
schedule, options, seed, last step; the towers excepted) unless given: one
line names each setting it changes (cli/model_dir/resume_settings.py).
Fine-tuning uses tf-slim's flags (cli/fine_tuning.py): --checkpoint_path
starts a new --model_dir from another run's checkpoint, without the
--checkpoint_exclude_scopes, training only --trainable_scopes.
Logs are quiet by default (progress lines with an ETA); --verbosity=1 shows
TensorFlow's own lines too.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

# First: a missing package is one line; then the C++ log level, set before
# anything imports TensorFlow (script_logging.before_tensorflow).
from cli import entry_point

# isort: split

# pylint: disable=g-import-not-at-top,wrong-import-position,g-bad-import-order
from absl import flags
from absl import logging
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu import cluster
from estimator_multigpu.cluster.all_reduce import stop_signal
from estimator_multigpu.cluster.all_reduce import training as all_reduce_training
from estimator_multigpu.cluster.ps import job as ps_job
from estimator_multigpu.runtime import evaluation
from estimator_multigpu.runtime import guards

import classifier
from cli import cluster_task
from cli import run_plan
from cli import run_setup
from cli import script_logging
from cli import settings as settings_lib
from cli import towers as towers_lib
from cli.flags import definitions as cli_flags
from cli.model_dir import checkpoints
from cli.model_dir import resume_settings
from cli.model_dir import run_config
from cli.model_dir import run_settings
from cli.model_dir import start
import datasets

FLAGS = flags.FLAGS
FLAG_GROUPS = (cli_flags.shared, cli_flags.training, cli_flags.fine_tuning,
               cli_flags.cluster)
cli_flags.define(*FLAG_GROUPS, data_checks=True)
Settings = settings_lib.TrainSettings
NOTHING_LEFT = -1  # `train`: an all-reduce job's chief was at --max_steps.


def train(settings: Settings, estimator: tf.estimator.Estimator,
          task: Optional[cluster.Task], towers: towers_lib.Towers, input_fn,
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
  all_reduce = task is not None and task.all_reduce
  with guards.SignalStop(blocked_secs=settings.run.stop_grace_secs,
                        on_blocked=_on_blocked(task)) as stop:
    def train_with(extra_hooks):
      # An all-reduce task stops at the step its job agrees on (cluster.all_reduce.stop_signal).
      own_stop = [] if all_reduce else [stop.hook()]
      estimator.train(
          input_fn, max_steps=max_steps,
          hooks=[guards.NonFiniteLossHook(model_dir), *own_stop,
                 *extra_hooks],
          saving_listeners=[guards.FiniteCheckpointListener(model_dir)])
      return True
    if task is None:
      train_with([])
    elif all_reduce:
      options = _all_reduce_options(settings, task, towers, estimator,
                                    setup)
      stopped = []
      if not all_reduce_training.run_task(
          estimator, train_with, settings.cluster.peer_timeout_secs,
          **options, stop_received=lambda: stop.received,
          on_stop=stopped.append):
        return NOTHING_LEFT
      return stopped[0] if stopped else None  # its line is logged.
    else:
      ps_job.run_trainer(task, train_with,
                              sync_replicas=settings.cluster.sync_replicas,
                              base_config=towers.session_config,
                              ps_wait_secs=settings.cluster.ps_wait_secs,
                              stop_requested=lambda: stop.received is not None,
                              hint=cluster_task.cluster_source(
                                  settings.cluster).end_hint)
  return stop.received


def _on_blocked(task: Optional[cluster.Task]):
  """What a stop signal whose step does not end within the grace does."""
  if task is None:
    return None
  if task.all_reduce:
    return all_reduce_training.abandon
  return lambda number, secs: ps_job.abandon(task, number, secs)


def _all_reduce_options(settings: Settings, task: cluster.Task,
                        towers: towers_lib.Towers,
                        estimator: tf.estimator.Estimator,
                        setup: run_setup.ModelSetup) -> dict:
  """`run_task`'s options for train.py: the settings every task must share
  (cli/model_dir/run_settings.py), the tasks' names as started, the grace
  time, where the cluster came from."""
  shared = run_settings.across_tasks(
      settings, estimator.params["classifier"], len(towers.devices), setup)
  return dict(max_steps=settings.optimization.max_steps,
              names=cluster_task.task_names(
                  task, settings.cluster.worker_hosts is not None),
              settings=shared, grace_secs=settings.run.stop_grace_secs,
              source=cluster_task.cluster_source(settings.cluster))


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


def run(task: Optional[cluster.Task], settings: Settings) -> int:
  """Runs this process's part of the job; returns its exit status."""
  if task is not None and task.type == cluster.PS:
    ps_job.serve_ps(task, settings.cluster.ps_linger_secs)
    return 0
  with checkpoints.writer_lock(task, settings.run.model_dir,
                               settings.run.min_free_disk_mb):
    planned = run_plan.plan(task, settings)
    if not start.check_and_record(task, settings, planned):
      return 0
    return run_planned(task, settings, planned)


def run_planned(task: Optional[cluster.Task], settings: Settings,
                planned: run_plan.Plan) -> int:
  """`run` once this task holds the model dir and its run is planned."""
  if settings.run.check_towers and task is None:
    check_towers(settings, planned)
  estimator = planned.estimator
  if task is None or task.type != cluster.EVALUATOR:
    received = train(settings, estimator, task, planned.towers,
                     planned.input_fn, planned.setup)
    return finish(task, settings, estimator, received)
  evaluate(settings, estimator, planned.setup)
  return 0


class TowersMismatchError(RuntimeError):
  """--check_towers: the towers do not train like one device."""


def check_towers(settings: Settings, planned: run_plan.Plan,
                 steps: int = 2) -> None:
  """--check_towers: one device against the towers, 2 steps, same start.

  Raises:
    TowersMismatchError: they differ; the message names the cause and fix.
  """
  logging.info("Checking that %d towers train %s like one device (%d "
               "steps each)...", len(planned.towers.devices),
               planned.setup.model_name, steps)
  report = emg.check_towers(
      classifier.model_fn, planned.input_fn, planned.towers.devices, steps,
      {"classifier": planned.config}, **settings.multi_gpu.options())
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
  if task is None or not task.all_reduce:  # an all-reduce task's is logged.
    logging.warning("Stopped by signal %d%s", received,
                    _saved(task, estimator, settings.run.model_dir))
  return 128 + received


def _saved(task: Optional[cluster.Task], estimator: tf.estimator.Estimator,
           model_dir: str) -> str:
  """What a stopped run saved: only a checkpoint that is on disk."""
  if task is not None and not task.is_chief:
    return ("; this worker writes no checkpoint (the chief saves in "
            f"{model_dir})")
  step = int(estimator.get_variable_value("global_step"))
  newest = stop_signal.checkpoint_step(model_dir)
  if newest == step:
    return f" at step {step}; checkpoint saved in {model_dir}"
  return (f" at step {step}; step {step} was not saved: the newest "
          f"checkpoint in {model_dir} is {newest}")


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
    sys.exit(run(None, resume_settings.keep_recorded(
        settings, run_config.read(settings.run.model_dir),
        {name for name in FLAGS if FLAGS[name].present})))
  logging.info("%s", cluster_task.start_line(task, settings.cluster))
  cluster.exit_process(run_cluster_task(task, settings))


if __name__ == "__main__":
  entry_point.run(main, __doc__)
