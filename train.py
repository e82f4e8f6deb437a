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
export.py need only --model_dir; a resume takes the net and data from it.
Fine-tuning uses tf-slim's flags (cli/fine_tuning.py): --checkpoint_path
starts a new --model_dir from another run's checkpoint, without the
--checkpoint_exclude_scopes, training only --trainable_scopes.
Logs are quiet by default (progress lines with an ETA); --verbosity=1 shows
TensorFlow's own lines too.
"""

from __future__ import annotations

import sys
from typing import Optional

from absl import flags
from absl import logging

from cli import script_logging

script_logging.before_tensorflow()  # C++ log level: before TensorFlow.

import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

import estimator_multigpu as emg
from estimator_multigpu import cluster
from estimator_multigpu.runtime import evaluation
from estimator_multigpu.runtime import hooks
from estimator_multigpu.runtime import scaling
from estimator_multigpu.cluster import job_control

import classifier
import datasets
from cli import cluster_flags
from cli import common_flags
from cli import errors
from cli import fine_tuning
from cli import model_dir_check
from cli import model_dir_flags
from cli import optimization_flags
from cli import run_checks
from cli import run_record
from cli import train_data_flags
from cli import validators

FLAGS = flags.FLAGS

flags.DEFINE_enum("optimizer", "momentum", list(classifier.OPTIMIZERS),
                  "Optimizer.")
flags.DEFINE_float("learning_rate", 0.05, "Initial learning rate.")
flags.DEFINE_float("momentum", 0.9, "Momentum (--optimizer=momentum; "
                   "rmsprop's is --rmsprop_momentum).")
flags.DEFINE_enum("learning_rate_decay_type", "cosine",
                  list(classifier.DECAY_TYPES), "Learning-rate schedule.")
flags.DEFINE_integer("decay_steps", None, "Steps of one decay period "
                     "(default: --max_steps minus warm-up).")
flags.DEFINE_float("end_learning_rate", 0.0, "Final rate (polynomial, "
                   "cosine).")
flags.DEFINE_integer("warmup_steps", 50, "Linear warm-up steps.")
flags.DEFINE_float("weight_decay", 1e-4, "L2 weight decay.")
flags.DEFINE_float("label_smoothing", 0.0, "Label smoothing.")
flags.DEFINE_integer("log_every_n_steps", None, "Progress line every N "
                     "steps (default: a tenth of --max_steps, at most 100).")
flags.DEFINE_float("clip_gradients_by_norm", None, "Clip the combined "
                   "gradient to this global norm.")
flags.DEFINE_enum("variable_update", "shared", ["shared", "replicated"],
                  "shared: one copy of the variables on the aggregation "
                  "device (tf_cnn_benchmarks parameter_server); replicated: "
                  "a copy per tower and all-reduced gradients "
                  "(tf_cnn_benchmarks replicated).")
flags.DEFINE_integer("accumulate_steps", 1, "Apply one update per K input "
                     "batches (gradient accumulation); the effective batch "
                     "is K x --batch_size and global_step counts updates.")
flags.DEFINE_enum("mixed_precision", None, ["bfloat16", "float16"],
                  "Compute in the towers in this precision (float32 master "
                  "weights; float16 with dynamic loss scaling).")
flags.DEFINE_bool("sync_batch_norm", False, "Batch norm over the global "
                  "batch: the towers all-reduce their moments, so N towers "
                  "train batch-norm nets (resnet_*, inception_*) exactly "
                  "like one device. Eval, predict and export are unchanged.")
flags.DEFINE_bool("scaling_report", True, "Warn when the run is "
                  "input-bound; its per-window report (input wait) shows "
                  "with --verbosity=1.")
optimization_flags.register_validators()
validators.register(data_flags=True)


def classifier_config(num_classes: int, sync_replicas: int = 0,
                      model_name: Optional[str] = None,
                      setup: Optional[common_flags.ModelSetup] = None
                      ) -> classifier.ClassifierConfig:
  """The model_fn's configuration from the flags (`model_name`: the net,
  default --model_name; `setup`: the data, default the data flags)."""
  decay_steps = FLAGS.decay_steps or max(FLAGS.max_steps - FLAGS.warmup_steps,
                                         1)
  settings = optimization_flags.classifier_settings(
      lambda: train_data_flags.epoch_size(setup),
      FLAGS.batch_size * FLAGS.accumulate_steps * max(sync_replicas, 1))
  return classifier.ClassifierConfig(
      model_name=model_name or FLAGS.model_name, num_classes=num_classes,
      weight_decay=FLAGS.weight_decay, label_smoothing=FLAGS.label_smoothing,
      optimizer=FLAGS.optimizer, learning_rate=FLAGS.learning_rate,
      momentum=FLAGS.momentum,
      learning_rate_decay_type=FLAGS.learning_rate_decay_type,
      end_learning_rate=FLAGS.end_learning_rate,
      warmup_steps=FLAGS.warmup_steps, sync_replicas=sync_replicas,
      **{"decay_steps": decay_steps, **settings})


def build_model_fn(towers: common_flags.Towers, ema_decay, clip_norm,
                   global_batch_size: int, max_steps: int,
                   log_every_n_steps: int, model_dir: Optional[str],
                   trainers: int = 1, sync_replicas: bool = False,
                   scaling_report: bool = True,
                   variable_update: str = "shared",
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
    run_checks.warn_small_batch_norm(tf.compat.v1.get_default_graph(),
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
                    towers: common_flags.Towers, model_dir: str,
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


def train_input_fn(image_size: int, num_classes: int, trainer: int = 0,
                   dataset_name: Optional[str] = None,
                   dataset_dir: Optional[str] = None, split: str = "train",
                   preprocessing_name: str = "resize", labels_offset: int = 0):
  """The training input; trainer k of a cluster shuffles with seed + k.

  `dataset_name` and `dataset_dir` default to the flags; the rest is
  `train_data_flags.train_data`'s.
  """
  return datasets.make_input_fn(
      dataset_name or FLAGS.dataset_name, split, FLAGS.batch_size,
      image_size=image_size, data_dir=dataset_dir or FLAGS.dataset_dir,
      num_classes=num_classes, seed=FLAGS.random_seed + trainer,
      is_training=True, preprocessing_name=preprocessing_name,
      labels_offset=labels_offset)


def log_every_n_steps(flag_value: Optional[int], max_steps: int) -> int:
  """--log_every_n_steps, else a tenth of the run (1..100 steps)."""
  if flag_value:
    return flag_value
  return max(1, min(100, max_steps // 10))


def make_estimator(task: Optional[cluster.Task], towers: common_flags.Towers,
                   config: classifier.ClassifierConfig, schedule: tuple,
                   warm_start_from=None) -> tf.estimator.Estimator:
  """The classifier Estimator for this task (summaries: chief/local only)."""
  summary_dir = FLAGS.model_dir if task is None or task.is_chief else None
  model_fn = build_model_fn(towers, FLAGS.moving_average_decay,
                            FLAGS.clip_gradients_by_norm, FLAGS.batch_size,
                            FLAGS.max_steps,
                            log_every_n_steps(FLAGS.log_every_n_steps,
                                              FLAGS.max_steps),
                            summary_dir, len(task.trainers) if task else 1,
                            FLAGS.sync_replicas, FLAGS.scaling_report,
                            variable_update=FLAGS.variable_update,
                            sync_batch_norm=FLAGS.sync_batch_norm,
                            accumulate_steps=FLAGS.accumulate_steps,
                            mixed_precision=FLAGS.mixed_precision)
  steps, secs = schedule
  return build_estimator(model_fn, config, towers, FLAGS.model_dir, steps,
                         FLAGS.save_summary_steps, FLAGS.random_seed, secs,
                         warm_start_from)


def train(estimator: tf.estimator.Estimator, task: Optional[cluster.Task],
          towers: common_flags.Towers, input_fn,
          setup: Optional[common_flags.ModelSetup] = None) -> Optional[int]:
  """Trains here or as a cluster trainer; returns the stopping signal."""
  logging.info("Training %s on %s: global batch %d over %d towers to step "
               "%d -> %s", setup.model_name if setup else FLAGS.model_name,
               setup.dataset_name if setup else FLAGS.dataset_name,
               FLAGS.batch_size, len(towers.devices), FLAGS.max_steps,
               FLAGS.model_dir)
  on_blocked = None if task is None else (
      lambda number, secs: job_control.abandon(task, number, secs))
  with hooks.SignalStop(blocked_secs=FLAGS.stop_grace_secs,
                        on_blocked=on_blocked) as stop:
    def train_with(extra_hooks):
      estimator.train(
          input_fn, max_steps=FLAGS.max_steps,
          hooks=[hooks.NonFiniteLossHook(FLAGS.model_dir), stop.hook(),
                 *extra_hooks],
          saving_listeners=[hooks.FiniteCheckpointListener(FLAGS.model_dir)])
    if task is None:
      train_with([])
    else:
      job_control.run_trainer(task, train_with,
                              sync_replicas=FLAGS.sync_replicas,
                              base_config=towers.session_config,
                              ps_wait_secs=FLAGS.ps_wait_secs,
                              stop_requested=lambda: stop.received is not None)
  return stop.received


def evaluate(estimator: tf.estimator.Estimator,
             setup: common_flags.ModelSetup) -> None:
  """The evaluator task: each new checkpoint of the chief, to max_steps."""
  input_fn = datasets.make_input_fn(
      setup.dataset_name, "eval", FLAGS.batch_size,
      image_size=setup.image_size, data_dir=setup.dataset_dir,
      num_classes=setup.num_classes, labels_offset=setup.labels_offset)
  metrics = evaluation.evaluate_checkpoints(
      lambda path: estimator.evaluate(input_fn, checkpoint_path=path),
      estimator.model_dir, FLAGS.max_steps, FLAGS.eval_timeout_secs)
  print(evaluation.format_metrics(metrics))


def run(task: Optional[cluster.Task]) -> int:
  """Runs this process's part of the job; returns its exit status."""
  if task is not None and task.type == cluster.PS:
    job_control.serve_ps(task, FLAGS.ps_linger_secs)
    return 0
  towers = common_flags.towers_from_flags()
  setup = common_flags.model_setup(FLAGS.model_dir)
  config = classifier_config(setup.num_classes, cluster_flags.replicas_to_aggregate(task),
                             setup.model_name, setup)
  schedule = model_dir_flags.checkpoint_schedule(FLAGS.save_checkpoints_steps,
                                 FLAGS.save_checkpoints_secs,
                                 FLAGS["save_checkpoints_steps"].present)
  towers = cluster_flags.prepare_task(task, towers)
  input_fn = train_input_fn(setup.image_size, setup.num_classes,
                            cluster_flags.trainer_number(task), setup.dataset_name,
                            setup.dataset_dir,
                            **train_data_flags.train_data(setup))
  config, warm_start = fine_tuning.from_flags(config, setup.record,
                                              FLAGS.model_dir, input_fn)
  if task is None or task.is_chief:
    model_dir_check.check_estimator(make_estimator(
        task, model_dir_check.one_tower(towers), config, schedule),
        model_dir_check.input_specs(input_fn), setup.num_classes)
    run_record.record_run(setup, config, towers, FLAGS.model_dir)
  estimator = make_estimator(task, towers, config, schedule, warm_start)
  if task is not None and task.type == cluster.EVALUATOR:
    evaluate(estimator, setup)
    return 0
  received = train(estimator, task, towers, input_fn, setup)
  if received is None:
    log_done(task)
    return 0
  step = (estimator.get_variable_value("global_step")
          if task is None or task.is_chief else "?")
  logging.warning("Stopped by signal %d at step %s; checkpoint saved in %s",
                  received, step, FLAGS.model_dir)
  return 128 + received


def log_done(task: Optional[cluster.Task]) -> None:
  """The last line of a finished trainer; the chief's says what is next."""
  if task is not None and not task.is_chief:
    logging.info("Training done (%s).", task.device)
    return
  logging.info("Training done: step %d in %s. Next: python eval.py "
               "--model_dir=%s (or export.py --model_dir=%s "
               "--export_dir=...)", FLAGS.max_steps, FLAGS.model_dir,
               FLAGS.model_dir, FLAGS.model_dir)


def run_cluster_task(task: cluster.Task) -> int:
  """`run(task)`; an error is one line (cli/errors.py) and its status."""
  try:
    return run(task)
  except Exception as error:  # pylint: disable=broad-except
    return errors.report(error, sys.argv, task.device)


def main(argv):
  del argv
  script_logging.configure(FLAGS.verbosity)
  task = cluster_flags.cluster_task()
  if task is None:
    sys.exit(run(None))
  cluster.exit_process(run_cluster_task(task))


if __name__ == "__main__":
  errors.run(main, __doc__)
