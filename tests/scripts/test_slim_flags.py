"""tf-slim's flags in train.py and eval.py: optimizer settings, epoch-based
decay, the split, the labels offset and the training augmentation."""

import dataclasses
import json
import os

from absl import flags
import numpy as np
import pytest
from script_runs import run_script
import tensorflow as tf

import classifier
from cli import run_setup
from cli import towers as towers_lib
from cli.flags import definitions as cli_flags
from cli.flags import optimization
from cli.model_dir import run_config
from cli.model_dir import run_record
import datasets
import eval as eval_script  # pylint: disable=unused-import  (its flags)
import train

FLAGS = flags.FLAGS
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

pytestmark = pytest.mark.usefixtures("parsed_flags")


def parse(*args):
  """Parses a fresh command line of the scripts' flags (restored later)."""
  FLAGS.unparse_flags()
  FLAGS(["script.py", *args])


def settings():
  """train.py's settings from the flags parsed last."""
  return cli_flags.read(train.Settings)


def model_setup(model_dir, training=False):
  return run_setup.model_setup(model_dir, settings().model, settings().data,
                               training)


def test_optimizer_settings_reach_the_optimizer():
  parse("--optimizer=ftrl", "--learning_rate_decay_type=fixed",
        "--ftrl_learning_rate_power=-1",
        "--ftrl_initial_accumulator_value=0.5", "--ftrl_l1=0.01",
        "--ftrl_l2=0.02")
  config = optimization.classifier_config(settings(), 10)
  assert classifier.optimizer_settings(config) == {
      "ftrl_learning_rate_power": -1.0, "ftrl_initial_accumulator_value": 0.5,
      "ftrl_l1": 0.01, "ftrl_l2": 0.02}
  with tf.Graph().as_default():
    optimizer = classifier.make_optimizer(config, 0.1)
  assert isinstance(optimizer, tf.compat.v1.train.FtrlOptimizer)
  assert (optimizer._learning_rate_power, optimizer._l1_regularization_strength,
          optimizer._l2_regularization_strength) == (-1.0, 0.01, 0.02)


def test_slims_decay_names():
  parse("--learning_rate_decay_type=exponential",
        "--learning_rate_decay_factor=0.3", "--staircase")
  config = optimization.classifier_config(settings(), 10)
  assert (config.decay_rate, config.staircase) == (0.3, True)
  parse("--learning_rate_decay_type=exponential",
        "--learning_rate_decay_factor=0.94")
  assert optimization.classifier_config(settings(), 10).decay_rate == 0.94


MISTAKES = [
    (["--optimizer=sgd", "--adam_beta1=0.8"],
     "--adam_beta1 is a setting of --optimizer=adam, but --optimizer=sgd "
     "has no use for it; drop --adam_beta1 or choose --optimizer=adam"),
    (["--optimizer=rmsprop", "--momentum=0.5"],
     "rmsprop's momentum is --rmsprop_momentum"),
    (["--optimizer=adam", "--opt_epsilon=0"], "flag --opt_epsilon=0.0: "
     "expected a number > 0"),
    (["--optimizer=adam", "--adam_beta2=1"], r"expected a number in \[0, 1\)"),
    (["--optimizer=adagrad", "--adagrad_initial_accumulator_value=-1"],
     "expected a number > 0"),
    (["--optimizer=ftrl", "--learning_rate_decay_type=fixed",
      "--ftrl_learning_rate_power=0.5"], "expected a number <= 0"),
    (["--optimizer=ftrl", "--learning_rate_decay_type=fixed",
      "--ftrl_l2=nan"], "expected a number >= 0"),
    (["--optimizer=ftrl"], "--optimizer=ftrl with "
     "--learning_rate_decay_type=cosine: FTRL's weights are proportional to "
     "the current learning rate.* add --learning_rate_decay_type=fixed"),
    (["--learning_rate_decay_factor=0.9"], "--learning_rate_decay_factor "
     "shapes the 'exponential' decay, but --learning_rate_decay_type=cosine "
     ".* add --learning_rate_decay_type=exponential"),
    (["--learning_rate_decay_type=exponential",
      "--learning_rate_decay_factor=1.5"], r"expected a factor in \(0, 1\]"),
    (["--num_epochs_per_decay=2", "--decay_steps=100"],
     "both set the decay period .* give only one"),
    (["--learning_rate_decay_type=fixed", "--num_epochs_per_decay=2"],
     "fixed does not decay"),
    (["--num_epochs_per_decay=0"], "expected a number of epochs > 0"),
    (["--staircase"], "--staircase shapes the 'exponential' decay"),
    (["--dataset_split_name=../train"], "letters, digits and underscores"),
    (["--labels_offset=-1"], "expected an offset >= 0"),
    (["--dataset_name=digits", "--labels_offset=1"],
     "digits has labels from class 0 .* --dataset_name=tfrecord"),
    (["--dataset_name=digits", "--preprocessing_name=crop_flip"],
     "digits, which a mirror turns into other shapes; use 'crop'"),
    (["--dataset_name=synthetic", "--preprocessing_name=crop"],
     "is random pixels; use 'resize'"),
]


@pytest.mark.parametrize("args,message", MISTAKES,
                         ids=[" ".join(args) for args, _ in MISTAKES])
def test_a_mistake_says_what_was_given_and_how_to_fix_it(args, message):
  with pytest.raises(flags.IllegalFlagValueError, match=message):
    parse(*args)


@pytest.mark.parametrize("accumulate,workers,expected", [
    # 1,437 training digits, 2 epochs per decay: 1437 / 64 * 2 = 44.9 steps;
    # an update of 2 batches: 1437 / 128 * 2 = 22.5; 3 synchronous workers
    # of one batch each: 1437 / 192 * 2 = 14.97 (tf-slim truncates).
    (1, 0, 44), (2, 0, 22), (1, 3, 14)])
def test_num_epochs_per_decay_gives_slims_decay_steps(accumulate, workers,
                                                      expected):
  parse("--learning_rate_decay_type=exponential", "--num_epochs_per_decay=2",
        "--batch_size=64", f"--accumulate_steps={accumulate}")
  config = optimization.classifier_config(settings(), 10, workers)
  assert config.decay_steps == expected


def test_epochs_of_synthetic_data_are_refused():
  parse("--dataset_name=synthetic", "--num_epochs_per_decay=1")
  with pytest.raises(ValueError, match="without epochs.*--decay_steps"):
    optimization.classifier_config(settings(), 10)


def test_each_script_has_its_own_default_split(tmp_path):
  fresh = str(tmp_path / "run")
  assert model_setup(fresh, training=True).dataset_split_name == "train"
  assert run_setup.split_name(settings().data, run_setup.EVAL_SPLIT) == "eval"
  parse("--dataset_split_name=validation")
  assert run_setup.split_name(settings().data,
                              run_setup.EVAL_SPLIT) == "validation"
  parse("--dataset_split_name=trainval")
  assert model_setup(fresh, training=True).dataset_split_name == "trainval"


def write_records(data_dir, split, labels):
  """Random 8x8 RGB PNG records with the given stored labels."""
  rng = np.random.RandomState(len(labels))
  os.makedirs(data_dir, exist_ok=True)
  path = os.path.join(data_dir, f"{split}-00000-of-00001.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    for label in labels:
      png = tf.io.encode_png(rng.randint(0, 256, (8, 8, 3), np.uint8))
      writer.write(datasets.make_example(png.numpy(), b"png", label, 8, 8)
                   .SerializeToString())
  datasets.write_label_file(["background", "a", "b", "c"], data_dir)


def test_labels_offset_sets_the_classes_and_is_recorded(tmp_path):
  data_dir, model_dir = str(tmp_path / "data"), str(tmp_path / "run")
  write_records(data_dir, "train", [1, 2, 3])
  parse("--dataset_name=tfrecord", f"--dataset_dir={data_dir}",
        "--labels_offset=1", "--image_size=8", "--preprocessing_name=crop_flip",
        "--model_name=mlp", "--batch_size=2")  # 3 records.
  setup = model_setup(model_dir, training=True)
  assert (setup.num_classes, setup.labels_offset) == (3, 1)  # 4 labels - 1.
  os.makedirs(model_dir)
  train_settings = dataclasses.replace(settings(), run=dataclasses.replace(
      settings().run, model_dir=model_dir))
  run_record.record_run(
      setup, optimization.classifier_config(settings(), 3, 0, None, setup),
      towers_lib.resolve_towers(None, None, 1), train_settings)
  record = json.load(open(run_config.path(model_dir)))
  assert (record["labels_offset"], record["preprocessing_name"],
          record["dataset_split_name"]) == (1, "crop_flip", "train")
  parse()  # eval.py with --model_dir alone: the recorded offset.
  setup = model_setup(model_dir)
  assert (setup.num_classes, setup.labels_offset) == (3, 1)
  parse("--batch_size=2")  # train.py's resume on the 3 records...
  assert model_setup(model_dir, training=True).preprocessing_name == (
      "crop_flip")  # ...keeps the augmentation.
  parse("--labels_offset=0")
  with pytest.raises(ValueError, match="--labels_offset=0 but --model_dir="
                     ".* was trained with labels_offset=1"):
    model_setup(model_dir)


def test_a_record_from_before_these_flags_loads(tmp_path):
  config = classifier.ClassifierConfig(optimizer="rmsprop", momentum=0.7)
  record = run_config.RunRecord(classifier=config, image_size=8,
                                dataset_name="digits")
  data = json.loads(record.to_json())
  for key in ("dataset_split_name", "preprocessing_name", "labels_offset"):
    del data[key]
  for key in ("rmsprop_momentum", "adam_beta1", "opt_epsilon", "staircase",
              "ftrl_l1"):
    del data["classifier"][key]
  (tmp_path / "run_config.json").write_text(json.dumps(data))
  loaded = run_config.read(str(tmp_path))
  # rmsprop used --momentum before it had its own --rmsprop_momentum.
  assert loaded.classifier.rmsprop_momentum == 0.7
  assert classifier.optimizer_settings(loaded.classifier)["opt_epsilon"] == 1
  assert (loaded.dataset_split_name, loaded.preprocessing_name,
          loaded.labels_offset) == ("train", "resize", 0)



@pytest.mark.slow
def test_a_slim_command_line_trains_and_evaluates(tmp_path):
  data_dir, model_dir = str(tmp_path / "data"), str(tmp_path / "run")
  write_records(data_dir, "trainval", [1, 2, 3] * 8)
  write_records(data_dir, "validation", [3, 2, 1])
  run_script("train.py", "--dataset_name=tfrecord", f"--dataset_dir={data_dir}",
             "--dataset_split_name=trainval", "--labels_offset=1",
             "--preprocessing_name=crop_flip", "--image_size=8",
             "--model_name=mlp", "--optimizer=adam", "--adam_beta1=0.8",
             "--opt_epsilon=0.1", "--learning_rate_decay_type=exponential",
             "--learning_rate_decay_factor=0.94", "--num_epochs_per_decay=2",
             "--staircase", "--batch_size=8", "--max_steps=6",
             "--warmup_steps=0", f"--model_dir={model_dir}")
  record = run_config.read(model_dir)
  # 24 records, 8 per step, 2 epochs: int(24 / 8 * 2) = 6 steps per decay.
  assert record.classifier.decay_steps == 6
  assert (record.classifier.num_classes, record.classifier.adam_beta1,
          record.classifier.opt_epsilon) == (3, 0.8, 0.1)
  assert (record.dataset_split_name, record.labels_offset,
          record.preprocessing_name) == ("trainval", 1, "crop_flip")
  # Stored labels 1..3 are classes 0..2 only with the recorded offset: the
  # in-graph range check would stop eval otherwise.
  evaluated = run_script("eval.py", f"--model_dir={model_dir}", "--once",
                         "--dataset_split_name=validation")
  last = evaluated.stdout.strip().splitlines()[-1]
  assert last.startswith("accuracy=") and "global_step=6" in last


def test_a_resume_compares_the_settings_of_the_optimizer_in_use():
  old = classifier.ClassifierConfig(optimizer="rmsprop", momentum=0.5,
                                    rmsprop_momentum=0.5)
  new = classifier.ClassifierConfig(optimizer="rmsprop", momentum=0.9,
                                    rmsprop_momentum=0.9, adam_beta1=0.8)
  # momentum and adam_beta1 do not act on rmsprop: not reported.
  assert run_config.schedule_changes(old, new) == [
      ("rmsprop_momentum", 0.5, 0.9)]


def test_eval_reads_a_training_split_once():
  setup = model_setup("/nonexistent")  # digits, no record.
  dataset = eval_script.eval_input_fn(setup, "train", 64)()
  # 1,437 training digits in batches of 64: 22 full batches and one of 29.
  sizes = [int(labels.shape[0]) for _, labels in dataset]
  assert sizes == [64] * 22 + [29]
