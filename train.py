"""Trains a nets/ classifier on N towers: python train.py [--flags].

With no flags it trains LeNet on the built-in digits (scikit-learn's 8x8
handwritten digits) on every GPU, or on 2 virtual CPU towers without GPUs.
It resumes from --model_dir when that holds a checkpoint. SIGTERM or Ctrl-C
stops it after the current step with a final checkpoint (exit status
128 + signal); a NaN or Inf loss stops it with an error naming the step,
leaving the last checkpoint intact.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

import common_flags
import estimator_multigpu as emg
from estimator_multigpu import classifier
from estimator_multigpu import data
from estimator_multigpu import hooks

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
flags.DEFINE_integer("min_free_disk_mb", 50, "Refuse to start when the model "
                     "dir's disk has less free space than this.")


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


def classifier_config(num_classes: int) -> classifier.ClassifierConfig:
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
      warmup_steps=FLAGS.warmup_steps)


def build_model_fn(towers: common_flags.Towers, ema_decay, clip_norm,
                   global_batch_size: int, max_steps: int,
                   log_every_n_steps: int, model_dir: str):
  """The classifier model_fn on the towers, with a progress hook."""
  wrapped = emg.multi_gpu(classifier.model_fn, devices=towers.devices,
                          ema_decay=ema_decay,
                          clip_gradients_by_norm=clip_norm)

  def progress(spec):
    return [hooks.ProgressHook(spec.loss, global_batch_size,
                               len(towers.devices), max_steps,
                               log_every_n_steps, model_dir)]

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


def train_input_fn(image_size: int, num_classes: int):
  return data.make_input_fn(
      FLAGS.dataset_name, "train", FLAGS.batch_size, image_size=image_size,
      data_dir=FLAGS.dataset_dir, num_classes=num_classes,
      seed=FLAGS.random_seed)


def main(argv):
  del argv
  towers = common_flags.resolve_towers(FLAGS.num_gpus, FLAGS.devices,
                                       FLAGS.virtual_cpus)
  num_classes = common_flags.num_classes(FLAGS.dataset_name,
                                         FLAGS.dataset_dir, FLAGS.num_classes)
  image_size = common_flags.image_size(FLAGS.model_name, FLAGS.dataset_name,
                                       FLAGS.image_size)
  config = classifier_config(num_classes)
  check_model_dir(FLAGS.model_dir, FLAGS.min_free_disk_mb)
  model_fn = build_model_fn(towers, FLAGS.moving_average_decay,
                            FLAGS.clip_gradients_by_norm, FLAGS.batch_size,
                            FLAGS.max_steps, FLAGS.log_every_n_steps,
                            FLAGS.model_dir)
  estimator = build_estimator(model_fn, config, towers, FLAGS.model_dir,
                              FLAGS.save_checkpoints_steps,
                              FLAGS.save_summary_steps, FLAGS.random_seed)
  logging.info("Training %s on %s: global batch %d over %d towers -> %s",
               FLAGS.model_name, FLAGS.dataset_name, FLAGS.batch_size,
               len(towers.devices), FLAGS.model_dir)
  with hooks.SignalStop() as stop:
    estimator.train(train_input_fn(image_size, num_classes),
                    max_steps=FLAGS.max_steps,
                    hooks=[hooks.NonFiniteLossHook(), stop.hook()])
  if stop.received is not None:
    step = estimator.get_variable_value("global_step")
    logging.warning("Stopped by signal %d at step %d; checkpoint saved in %s",
                    stop.received, step, FLAGS.model_dir)
    sys.exit(128 + stop.received)


if __name__ == "__main__":
  app.run(main)
