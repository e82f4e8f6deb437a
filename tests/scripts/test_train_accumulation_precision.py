"""train.py's --accumulate_steps and --mixed_precision, in process."""

import glob
import os

from absl import flags
import pytest
import tensorflow as tf

from cli import run_estimator
from cli import run_plan
from cli import run_setup
from cli import towers as towers_lib
from cli.flags import definitions as cli_flags
from cli.flags import optimization
import train

tf1 = tf.compat.v1
FLAGS = flags.FLAGS


pytestmark = pytest.mark.usefixtures("parsed_flags")


def scalar_tags(directory):
  tags = set()
  for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
    for event in tf1.train.summary_iterator(path):
      tags |= {value.tag for value in event.summary.value}
  return tags


def test_flags_reach_the_wrapper(tmp_path):
  # 4 steps of 2 micro-batches of 8 digits each: global_step counts the 4
  # updates; float16 adds the loss-scale summaries.
  FLAGS(["test", "--accumulate_steps=2", "--mixed_precision=float16",
         "--model_name=mlp", "--max_steps=4", "--batch_size=8"])
  towers = towers_lib.resolve_towers(None, None, 2)
  settings = cli_flags.read(train.Settings)
  model_fn = run_estimator.build_model_fn(
      towers, None, None, 8, 4, 2, str(tmp_path),
      accumulate_steps=FLAGS.accumulate_steps,
      mixed_precision=FLAGS.mixed_precision)
  estimator = run_estimator.build_estimator(
      model_fn, optimization.classifier_config(settings, 10), towers,
      str(tmp_path), 100, 1, 1)
  digits = run_setup.ModelSetup("mlp", 10, 8, "digits", None,
                                dataset_split_name="train",
                                preprocessing_name="resize")
  estimator.train(run_plan.train_input_fn(settings, digits), max_steps=4)
  assert estimator.get_variable_value("global_step") == 4
  assert {"loss", "loss_scale", "skipped_updates"} <= scalar_tags(
      str(tmp_path))


def test_bad_mixed_precision_flag_is_refused():
  with pytest.raises(flags.IllegalFlagValueError):
    FLAGS(["test", "--mixed_precision=fp8"])
