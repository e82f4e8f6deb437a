"""Trains a nets/ classifier on N towers: python train.py [--flags].

With no flags it trains LeNet on the built-in digits (scikit-learn's 8x8
handwritten digits) on every GPU, or on 2 virtual CPU towers without GPUs.
It resumes from --model_dir when that holds a checkpoint. SIGTERM or Ctrl-C
stops it after the current step with a final checkpoint (exit status
128 + signal); a NaN or Inf loss stops it with an error naming the step,
leaving the last checkpoint intact.

On a cluster (docs/distributed.md) every task runs this script with the same
--ps_hosts and --worker_hosts plus its own --job_name (ps, worker, evaluator)
and --task_index (worker 0 is the chief), or with a TF_CONFIG environment
variable instead of those flags. --sync_replicas averages one gradient from
each worker per step; without it the workers update asynchronously.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
from typing import Optional

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu import cluster
from estimator_multigpu import hooks
from estimator_multigpu import scaling
from estimator_multigpu.cluster import job_control

import classifier
import common_flags
import datasets

FLAGS = flags.FLAGS

flags.DEFINE_enum("optimizer", "momentum", list(classifier.OPTIMIZERS),
                  "Optimizer.")
flags.DEFINE_float("learning_rate", 0.05, "Initial learning rate.")
flags.DEFINE_float("momentum", 0.9, "Momentum (momentum and rmsprop).")
flags.DEFINE_enum("learning_rate_decay_type", "cosine",
                  list(classifier.DECAY_TYPES), "Learning-rate schedule.")
flags.DEFINE_integer("decay_steps", None, "Steps of one decay period "
                     "(default: --max_steps minus warm-up).")
flags.DEFINE_float("decay_rate", 0.5, "Exponential decay factor per period.")
flags.DEFINE_float("end_learning_rate", 0.0, "Final rate (polynomial, "
                   "cosine).")
flags.DEFINE_integer("warmup_steps", 50, "Linear warm-up steps.")
flags.DEFINE_float("weight_decay", 1e-4, "L2 weight decay.")
flags.DEFINE_float("label_smoothing", 0.0, "Label smoothing.")
flags.DEFINE_integer("save_checkpoints_steps", 500, "Checkpoint every N "
                     "steps.")
flags.DEFINE_integer("save_summary_steps", 100, "Summaries every N steps.")
flags.DEFINE_integer("log_every_n_steps", 100, "Progress line every N steps.")
flags.DEFINE_float("clip_gradients_by_norm", None, "Clip the combined "
                   "gradient to this global norm.")
flags.DEFINE_bool("sync_batch_norm", False, "Batch norm over the global "
                  "batch: the towers all-reduce their moments, so N towers "
                  "train batch-norm nets (resnet_*, inception_*) exactly "
                  "like one device. Eval, predict and export are unchanged.")
flags.DEFINE_bool("scaling_report", True, "Log the scaling report (input "
                  "wait, per-tower throughput) and warn when input-bound.")
flags.DEFINE_integer("min_free_disk_mb", 50, "Refuse to start when the model "
                     "dir's disk has less free space than this.")
flags.DEFINE_list("ps_hosts", None, "Cluster: ps addresses, host:port,...")
flags.DEFINE_list("worker_hosts", None, "Cluster: worker addresses, "
                  "host:port,... (the first is the chief).")
flags.DEFINE_enum("job_name", None, [cluster.PS, cluster.WORKER,
                                     cluster.EVALUATOR],
                  "Cluster: this task's job.")
flags.DEFINE_integer("task_index", 0, "Cluster: this task's index in its job "
                     "(worker 0 is the chief).")
flags.DEFINE_bool("sync_replicas", False, "Cluster: average one gradient "
                  "from each worker per step (SyncReplicasOptimizer); "
                  "default asynchronous updates.")
flags.DEFINE_integer("ps_wait_secs", 120, "Cluster: a worker fails if a ps "
                     "task does not answer within this time, at the start "
                     "or while training.")
flags.DEFINE_integer("ps_linger_secs", 60, "Cluster: a ps exits this long "
                     "after the chief finished even if a worker never "
                     "reported.")
flags.DEFINE_integer("eval_timeout_secs", 600, "Cluster: the evaluator stops "
                     "after this long without a new checkpoint.")


def check_model_dir(model_dir: str, min_free_mb: int) -> None:
  """Fails before any step when checkpoints could not be written.

  Raises:
    OSError: the directory cannot be created or written, or its disk has
      less than `min_free_mb` MB free.
  """
  try:
    os.makedirs(model_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=model_dir, prefix=".write_check"):
      pass
  except OSError as error:
    reason = error.strerror or str(error)
    raise OSError(
        f"--model_dir={model_dir} cannot be written ({reason}); checkpoints "
        "would be lost. Choose a writable directory.") from error
  free_mb = shutil.disk_usage(model_dir).free / 2**20
  if free_mb < min_free_mb:
    raise OSError(
        f"--model_dir={model_dir} has {free_mb:.0f} MB free, less than "
        f"--min_free_disk_mb={min_free_mb}; checkpoints would fail. Free "
        "some space or choose another directory.")


def classifier_config(num_classes: int,
                      sync_replicas: int = 0) -> classifier.ClassifierConfig:
  """The model_fn's configuration from the flags."""
  decay_steps = FLAGS.decay_steps or max(FLAGS.max_steps - FLAGS.warmup_steps,
                                         1)
  return classifier.ClassifierConfig(
      model_name=FLAGS.model_name, num_classes=num_classes,
      weight_decay=FLAGS.weight_decay, label_smoothing=FLAGS.label_smoothing,
      optimizer=FLAGS.optimizer, learning_rate=FLAGS.learning_rate,
      momentum=FLAGS.momentum,
      learning_rate_decay_type=FLAGS.learning_rate_decay_type,
      decay_steps=decay_steps, decay_rate=FLAGS.decay_rate,
      end_learning_rate=FLAGS.end_learning_rate,
      warmup_steps=FLAGS.warmup_steps, sync_replicas=sync_replicas)


def build_model_fn(towers: common_flags.Towers, ema_decay, clip_norm,
                   global_batch_size: int, max_steps: int,
                   log_every_n_steps: int, model_dir: Optional[str],
                   trainers: int = 1, sync_replicas: bool = False,
                   scaling_report: bool = True,
                   sync_batch_norm: bool = False):
  """The classifier model_fn on the towers, with progress (and scaling) hooks.

  The hook writes throughput summaries to `model_dir` (None: only logs). On
  a cluster of `trainers` workers it reports the whole cluster's examples
  per second: a global step is one worker's batch, or with `sync_replicas`
  one batch from each worker.
  """
  wrapped = emg.multi_gpu(classifier.model_fn, devices=towers.devices,
                          ema_decay=ema_decay,
                          clip_gradients_by_norm=clip_norm,
                          sync_batch_norm=sync_batch_norm)
  examples_per_step = global_batch_size * (trainers if sync_replicas else 1)

  num_towers = len(towers.devices) * trainers

  def progress(spec):
    report = [scaling.ScalingReportHook(examples_per_step, num_towers,
                                        every_n_steps=log_every_n_steps)]
    return [hooks.ProgressHook(spec.loss, examples_per_step, num_towers,
                               max_steps, log_every_n_steps, model_dir),
            *(report if scaling_report else [])]

  return hooks.with_training_hooks(wrapped, progress)


def build_estimator(model_fn, config: classifier.ClassifierConfig,
                    towers: common_flags.Towers, model_dir: str,
                    save_checkpoints_steps: int, save_summary_steps: int,
                    random_seed: int) -> tf.estimator.Estimator:
  run_config = tf.estimator.RunConfig(
      model_dir=model_dir, session_config=towers.session_config,
      save_checkpoints_steps=save_checkpoints_steps,
      save_summary_steps=save_summary_steps, tf_random_seed=random_seed,
      keep_checkpoint_max=5, log_step_count_steps=None)
  return tf.estimator.Estimator(model_fn, config=run_config,
                                params={"classifier": config})


def train_input_fn(image_size: int, num_classes: int, trainer: int = 0):
  """The training input; trainer k of a cluster shuffles with seed + k."""
  return datasets.make_input_fn(
      FLAGS.dataset_name, "train", FLAGS.batch_size, image_size=image_size,
      data_dir=FLAGS.dataset_dir, num_classes=num_classes,
      seed=FLAGS.random_seed + trainer)


def cluster_task() -> Optional[cluster.Task]:
  """This process's cluster task (flags, else TF_CONFIG); None: local."""
  task = cluster.resolve_task(FLAGS.ps_hosts, FLAGS.worker_hosts,
                              FLAGS.job_name, FLAGS.task_index,
                              os.environ.get("TF_CONFIG"))
  if task is None and FLAGS.sync_replicas:
    raise ValueError("--sync_replicas synchronizes the workers of a cluster; "
                     "give --ps_hosts, --worker_hosts and --job_name (or "
                     "TF_CONFIG), or drop it.")
  return task


def trainer_number(task: Optional[cluster.Task]) -> int:
  """0 for the chief (or a local run), i for worker i of the flags."""
  if task is None or task.type != cluster.WORKER:
    return 0
  return task.index + 1


def replicas_to_aggregate(task: Optional[cluster.Task]) -> int:
  """Workers whose gradients each step averages; 0 for asynchronous."""
  return len(task.trainers) if task and FLAGS.sync_replicas else 0


def prepare_task(task: Optional[cluster.Task],
                 towers: common_flags.Towers) -> common_flags.Towers:
  """Checks the model dir where this task writes; tells Estimator the task.

  Returns:
    The towers, with the session config for this task.
  """
  if task is None or task.type in (cluster.CHIEF, cluster.EVALUATOR):
    check_model_dir(FLAGS.model_dir, FLAGS.min_free_disk_mb)
  if task is None:
    return towers
  os.environ["TF_CONFIG"] = task.tf_config()  # read by RunConfig.
  logging.info("Cluster task %s (TF_CONFIG=%s)", task.device,
               task.tf_config())
  return dataclasses.replace(towers, session_config=cluster.session_config(
      task, towers.session_config))


def make_estimator(task: Optional[cluster.Task], towers: common_flags.Towers,
                   config: classifier.ClassifierConfig
                   ) -> tf.estimator.Estimator:
  """The classifier Estimator for this task (summaries: chief/local only)."""
  summary_dir = FLAGS.model_dir if task is None or task.is_chief else None
  model_fn = build_model_fn(towers, FLAGS.moving_average_decay,
                            FLAGS.clip_gradients_by_norm, FLAGS.batch_size,
                            FLAGS.max_steps, FLAGS.log_every_n_steps,
                            summary_dir, len(task.trainers) if task else 1,
                            FLAGS.sync_replicas, FLAGS.scaling_report,
                            FLAGS.sync_batch_norm)
  return build_estimator(model_fn, config, towers, FLAGS.model_dir,
                         FLAGS.save_checkpoints_steps,
                         FLAGS.save_summary_steps, FLAGS.random_seed)


def train(estimator: tf.estimator.Estimator, task: Optional[cluster.Task],
          towers: common_flags.Towers, input_fn) -> Optional[int]:
  """Trains here or as a cluster trainer; returns the stopping signal."""
  logging.info("Training %s on %s: global batch %d over %d towers -> %s",
               FLAGS.model_name, FLAGS.dataset_name, FLAGS.batch_size,
               len(towers.devices), FLAGS.model_dir)
  with hooks.SignalStop() as stop:
    def train_with(extra_hooks):
      estimator.train(input_fn, max_steps=FLAGS.max_steps,
                      hooks=[hooks.NonFiniteLossHook(), stop.hook(),
                             *extra_hooks])
    if task is None:
      train_with([])
    else:
      job_control.run_trainer(task, train_with,
                              sync_replicas=FLAGS.sync_replicas,
                              base_config=towers.session_config,
                              ps_wait_secs=FLAGS.ps_wait_secs)
  return stop.received


def evaluate(estimator: tf.estimator.Estimator, image_size: int,
             num_classes: int) -> None:
  """The evaluator task: each new checkpoint of the chief, to max_steps."""
  input_fn = datasets.make_input_fn(
      FLAGS.dataset_name, "eval", FLAGS.batch_size, image_size=image_size,
      data_dir=FLAGS.dataset_dir, num_classes=num_classes)
  metrics = cluster.evaluate_checkpoints(estimator, input_fn, FLAGS.max_steps,
                                         FLAGS.eval_timeout_secs)
  print(" ".join(f"{k}={v:.4f}" if isinstance(v, (float, np.floating)) else
                 f"{k}={v}" for k, v in sorted(metrics.items())))


def run(task: Optional[cluster.Task]) -> int:
  """Runs this process's part of the job; returns its exit status."""
  if task is not None and task.type == cluster.PS:
    job_control.serve_ps(task, FLAGS.ps_linger_secs)
    return 0
  towers, num_classes, image_size = common_flags.setup_from_flags()
  config = classifier_config(num_classes, replicas_to_aggregate(task))
  towers = prepare_task(task, towers)
  estimator = make_estimator(task, towers, config)
  if task is not None and task.type == cluster.EVALUATOR:
    evaluate(estimator, image_size, num_classes)
    return 0
  received = train(estimator, task, towers, train_input_fn(
      image_size, num_classes, trainer_number(task)))
  if received is None:
    return 0
  step = (estimator.get_variable_value("global_step")
          if task is None or task.is_chief else "?")
  logging.warning("Stopped by signal %d at step %s; checkpoint saved in %s",
                  received, step, FLAGS.model_dir)
  return 128 + received


def run_cluster_task(task: cluster.Task) -> int:
  """`run(task)`, with an error logged (traceback) as exit status 1."""
  try:
    return run(task)
  except Exception:  # pylint: disable=broad-except
    logging.exception("Task %s failed.", task.device)
    return 1


def main(argv):
  del argv
  task = cluster_task()
  if task is None:
    sys.exit(run(None))
  cluster.exit_process(run_cluster_task(task))


if __name__ == "__main__":
  app.run(main)
