"""Exports a trained classifier as a SavedModel for serving.

    python export.py --model_dir=runs/digits --export_dir=exports/digits

Everything else comes from the model_dir's run_config.json (written by
train.py): the net, classes, image size and preprocessing. The SavedModel
(in a numbered subdirectory of --export_dir, printed last) has three
signatures, each returning `classes` and `probabilities`:

  serving_default          `images`: a uint8 batch [N, H, W, C] of pixels
                           0..255 (any N, H, W), as image libraries return
                           them.
  float:serving_default    `images`: a float32 batch of raw pixels in the
                           dataset's own range: 0..16 for digits, 0..255 for
                           TFRecord images.
  encoded:serving_default  `image_bytes`: a string batch [N] of JPEG or PNG
                           files (any mix, any sizes; 0..255 is black..white).

The graph decodes, resizes and scales as training did, so one picture gets
the same answer either way (a digits PNG holds round(pixel * 255 / 16);
see serving.py). It holds no tower structure and no device placement: it
serves on one CPU. The moving-average weights are exported when the
checkpoint has them (--nouse_ema_weights: the raw ones).
"""

from __future__ import annotations

import os
from typing import Optional

# First: a missing package is one line; then the C++ log level, set before
# anything imports TensorFlow (script_logging.before_tensorflow).
from cli import entry_point

# isort: split

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

import estimator_multigpu as emg

import classifier
from cli import cluster_task
from cli import run_setup
from cli import script_logging
from cli import settings as settings_lib
from cli.flags import definitions as cli_flags
from cli.model_dir import checkpoints
from cli.model_dir import restore_check
import datasets
import serving

FLAGS = flags.FLAGS
FLAG_GROUPS = (cli_flags.shared, cli_flags.weights, cli_flags.export)
cli_flags.define(*FLAG_GROUPS)
Settings = settings_lib.ExportSettings


def serving_specs(image_size: int, preprocessing: dict) -> tuple:
  """(features, labels) specs of the net's input in the serving graph."""
  return (tf.TensorSpec([None, image_size, image_size,
                         preprocessing.get("channels")], tf.float32), None)


def build_estimator(config: classifier.ClassifierConfig, model_dir: str,
                    use_ema: bool) -> tf.estimator.Estimator:
  """The classifier on one tower (export has no towers, no devices)."""
  model_fn = emg.multi_gpu(classifier.model_fn, devices=None,
                           ema_decay=0.999 if use_ema else None)  # names only.
  return tf.estimator.Estimator(model_fn, model_dir=model_dir,
                                params={"classifier": config})


def latest_checkpoint(model_dir: str, flag_value: Optional[str]) -> str:
  """--checkpoint_path (a directory: its latest), else the model_dir's latest.

  Raises:
    FileNotFoundError: there is none, or --checkpoint_path names none.
  """
  if flag_value:
    return checkpoints.resolve_checkpoint(flag_value)
  checkpoint = tf.train.latest_checkpoint(model_dir)
  if checkpoint is None:
    raise FileNotFoundError(
        f"--model_dir={model_dir} holds no checkpoint; run train.py with the "
        "same --model_dir first, or give --checkpoint_path.")
  return checkpoint


def export(settings: Settings) -> str:
  """Exports the model_dir's classifier; returns the SavedModel's path."""
  model_dir = settings.model_dir
  setup = run_setup.model_setup(model_dir, settings.model, settings.data)
  checkpoint = latest_checkpoint(model_dir, settings.checkpoint_path)
  use_ema = settings.use_ema_weights and checkpoints.checkpoint_has_ema(
      checkpoint)
  preprocessing = ((setup.record.preprocessing if setup.record else None)
                   or datasets.preprocessing(setup.dataset_name))
  logging.info("Exporting %s (%s weights; %s, %d classes, %dx%d input, "
               "pixels x %.4g)", checkpoint,
               "moving-average" if use_ema else "raw", setup.model_name,
               setup.num_classes, setup.image_size, setup.image_size,
               preprocessing.get("pixel_scale", 1.0))
  estimator = build_estimator(setup.classifier_config(), model_dir, use_ema)
  restore_check.check_estimator(estimator, serving_specs(
      setup.image_size, preprocessing), setup.num_classes,
                                  tf.estimator.ModeKeys.PREDICT, checkpoint)
  path = estimator.export_saved_model(
      settings.export_dir, serving.receiver_fn(setup.image_size,
                                               preprocessing),
      checkpoint_path=checkpoint)
  return path.decode() if isinstance(path, bytes) else path


def main(argv):
  del argv
  script_logging.configure(FLAGS.verbosity)
  cluster_task.check_tf_config(os.environ.get("TF_CONFIG"))
  settings = cli_flags.read(Settings)
  if not settings.export_dir:
    raise app.UsageError("--export_dir is required: where to write the "
                         "SavedModel, e.g. --export_dir=exports/digits.")
  print(export(settings))


if __name__ == "__main__":
  entry_point.run(main, __doc__)
