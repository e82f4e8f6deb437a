"""Fine-tuning with tf-slim's flags (train.py) and eval.py's --checkpoint_path
and --max_num_batches.

A LeNet trained for a few steps on the digits with 12 classes is the source;
a copy is fine-tuned to the digits' 10 classes in a new model_dir, the
logits excluded from the restore and only fc3 and the logits trained. Which
variables moved is read back from the checkpoints with
`tf.train.load_variable` and compared with the source's values.
"""

import math
import os
import subprocess
import sys

from absl import flags
import numpy as np
import pytest
import tensorflow as tf

import classifier
from cli import checkpoint_flags
from cli import common_flags
from cli import fine_tuning
from cli import run_config
import datasets
import eval as eval_script
import train

FLAGS = flags.FLAGS
tf1 = tf.compat.v1
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
SOURCE_CLASSES, TARGET_CLASSES = 12, 10
SOURCE_STEPS, TARGET_STEPS = 6, 4
BATCH = 16
# LeNet's variables (nets/lenet.py), each a weights and a biases.
FROZEN = ("LeNet/conv1", "LeNet/conv2")
TRAINED = ("LeNet/fc3",)
LOGITS = "LeNet/fc4"

pytestmark = pytest.mark.usefixtures("parsed_flags")


def lenet_config(num_classes, **fields):
  return classifier.ClassifierConfig(
      model_name="lenet", num_classes=num_classes, learning_rate=0.1,
      **fields)


def digits_input_fn():
  return datasets.make_input_fn("digits", "train", BATCH, seed=1)


def train_lenet(model_dir, config, steps, variable_update="shared",
                warm_start=None):
  """`steps` steps of `config` on 2 CPU towers, EMA on; a checkpoint at
  step 0 (Estimator's first save) and at `steps`."""
  towers = common_flags.resolve_towers(None, None, 2)
  model_fn = train.build_model_fn(towers, 0.9, None, BATCH, steps, steps,
                                  None, variable_update=variable_update,
                                  scaling_report=False)
  estimator = train.build_estimator(model_fn, config, towers, model_dir,
                                    steps, 1000, 1, warm_start_from=warm_start)
  estimator.train(digits_input_fn(), max_steps=steps)
  return estimator


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """The source run's model_dir (12 classes, step SOURCE_STEPS)."""
  model_dir = str(tmp_path_factory.mktemp("source"))
  with tf.Graph().as_default():
    train_lenet(model_dir, lenet_config(SOURCE_CLASSES), SOURCE_STEPS)
  return model_dir


def value(checkpoint, name):
  return tf.train.load_variable(checkpoint, name)


def names_under(scopes):
  return [f"{scope}/{part}" for scope in scopes for part in ("weights",
                                                             "biases")]


def give_fine_tuning_flags(checkpoint_path, exclude=None, trainable=None,
                           ignore_missing=False):
  FLAGS.checkpoint_path = checkpoint_path
  FLAGS.checkpoint_exclude_scopes = exclude
  FLAGS.trainable_scopes = trainable
  FLAGS.ignore_missing_vars = ignore_missing
  FLAGS.moving_average_decay = 0.9  # as train_lenet's.


@pytest.mark.parametrize("variable_update", ["shared", "replicated"])
def test_fine_tune_restores_freezes_and_trains_the_right_variables(
    source, tmp_path, variable_update):
  give_fine_tuning_flags(source, exclude=[LOGITS],
                         trainable=[*TRAINED, LOGITS])
  model_dir = str(tmp_path / "fine_tuned")
  config, warm_start = fine_tuning.from_flags(
      lenet_config(TARGET_CLASSES), None, model_dir, digits_input_fn())
  assert config.trainable_scopes == (*TRAINED, LOGITS)
  with tf.Graph().as_default():
    train_lenet(model_dir, config, TARGET_STEPS, variable_update, warm_start)

  source_ckpt = os.path.join(source, f"model.ckpt-{SOURCE_STEPS}")
  start = os.path.join(model_dir, "model.ckpt-0")
  end = os.path.join(model_dir, f"model.ckpt-{TARGET_STEPS}")
  for name in names_under(FROZEN + TRAINED):  # restored: start = source.
    np.testing.assert_array_equal(value(start, name), value(source_ckpt, name))
  for name in names_under(FROZEN):  # frozen: still the source's.
    np.testing.assert_array_equal(value(end, name), value(source_ckpt, name))
  for name in names_under(TRAINED + (LOGITS,)):  # trained: moved.
    assert np.abs(value(end, name) - value(start, name)).max() > 0, name
  # The excluded logits: the new shape, freshly initialized (weights from
  # LeNet's truncated normal of stddev 0.1, so within 2 x 0.1; biases 0).
  weights = value(start, f"{LOGITS}/weights")
  assert weights.shape == (512, TARGET_CLASSES)
  assert np.abs(weights).max() <= 0.2 and weights.std() > 0.05
  np.testing.assert_array_equal(value(start, f"{LOGITS}/biases"),
                                np.zeros(TARGET_CLASSES))
  stored = dict(tf.train.list_variables(end))
  # global_step and the moving averages are not the source's: step 0 at
  # the start; each shadow starts at its variable's (restored) value.
  assert value(start, "global_step") == 0
  for name in names_under(FROZEN + TRAINED):
    np.testing.assert_array_equal(
        value(start, f"{name}/ExponentialMovingAverage"),
        value(source_ckpt, name))
  # Optimizer slots exist for the trained variables only.
  assert {f"{name}/Momentum" for name in names_under(TRAINED + (LOGITS,))} \
      == {name for name in stored if name.endswith("/Momentum")}
