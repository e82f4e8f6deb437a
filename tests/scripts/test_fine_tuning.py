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
import re

from absl import flags
import numpy as np
import pytest
from script_runs import run_script
import tensorflow as tf

import classifier
from cli import fine_tuning
from cli import run_estimator
from cli import settings
from cli import towers as towers_lib
from cli.model_dir import run_config
import datasets
import eval as eval_script
import train  # noqa: F401 (defines train.py's flags, which the tests parse)

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
  towers = towers_lib.resolve_towers(None, None, 2)
  model_fn = run_estimator.build_model_fn(
      towers, 0.9, None, BATCH, steps, steps, None,
      variable_update=variable_update, scaling_report=False)
  estimator = run_estimator.build_estimator(model_fn, config, towers,
                                            model_dir,
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


def fine_tuning_settings(checkpoint_path, exclude=None, trainable=None,
                         ignore_missing=False):
  """What --checkpoint_path, --checkpoint_exclude_scopes, --trainable_scopes
  and --ignore_missing_vars give."""
  return settings.FineTuningSettings(
      checkpoint_path, None if exclude is None else tuple(exclude),
      None if trainable is None else tuple(trainable), ignore_missing)


def apply_fine_tuning(tuning, config, model_dir):
  """`fine_tuning.apply` with moving averages, as train_lenet's."""
  return fine_tuning.apply(tuning, config, None, model_dir, digits_input_fn(),
                           averaged=True)


@pytest.mark.parametrize("variable_update", ["shared", "replicated"])
def test_fine_tune_restores_freezes_and_trains_the_right_variables(
    source, tmp_path, variable_update):
  tuning = fine_tuning_settings(source, exclude=[LOGITS],
                                trainable=[*TRAINED, LOGITS])
  model_dir = str(tmp_path / "fine_tuned")
  config, warm_start = apply_fine_tuning(
      tuning, lenet_config(TARGET_CLASSES), model_dir)
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


# LeNet on the 8x8x1 digits with 10 classes, by hand: 5x5 convolutions of 32
# and 64 filters; two SAME 2x2 poolings take 8x8 to 2x2, so fc3 sees
# 2 * 2 * 64 = 256 inputs; fc3 has 512 units.
LENET_SHAPES = {
    "LeNet/conv1/weights": (5, 5, 1, 32), "LeNet/conv1/biases": (32,),
    "LeNet/conv2/weights": (5, 5, 32, 64), "LeNet/conv2/biases": (64,),
    "LeNet/fc3/weights": (256, 512), "LeNet/fc3/biases": (512,),
    "LeNet/fc4/weights": (512, 10), "LeNet/fc4/biases": (10,)}


def save_checkpoint(prefix, shapes):
  """A checkpoint of random values with these variable names and shapes."""
  rng = np.random.default_rng(0)
  with tf.Graph().as_default():
    variables = {name: tf1.Variable(
        0.1 * rng.standard_normal(shape).astype(np.float32), name="v")
                 for name, shape in shapes.items()}
    with tf1.Session() as session:
      session.run(tf1.global_variables_initializer())
      return tf1.train.Saver(variables).save(session, prefix)


def fine_tune_plan(tmp_path, checkpoint_path, **flag_values):
  """`fine_tuning.apply` for LeNet on the digits, in a new model_dir."""
  return apply_fine_tuning(fine_tuning_settings(checkpoint_path, **flag_values),
                           lenet_config(TARGET_CLASSES), str(tmp_path / "new"))


def test_net_variables_are_the_one_device_names_and_shapes():
  variables = fine_tuning.net_variables(lenet_config(10), digits_input_fn())
  assert {v.name: v.shape for v in variables} == LENET_SHAPES
  assert all(v.trainable and v.averaged for v in variables)


def test_warm_start_restores_exactly_the_net_and_starts_the_averages(
    tmp_path):
  checkpoint = save_checkpoint(str(tmp_path / "src" / "model.ckpt-3"),
                               LENET_SHAPES)
  _, settings = fine_tune_plan(tmp_path, str(tmp_path / "src"))
  assert settings.ckpt_to_initialize_from == checkpoint  # the dir's latest.
  names = list(LENET_SHAPES)
  shadows = [f"{name}/ExponentialMovingAverage" for name in names]
  others = ["global_step", "LeNet/fc4/weights/Momentum",
            "tower_1/LeNet/fc4/weights", "LeNet/fc4/weights_1"]
  # Estimator matches each pattern with re.match on `<name>:0`.
  matched = {name for name in names + shadows + others
             if any(re.match(pattern, name + ":0")
                    for pattern in settings.vars_to_warm_start)}
  assert matched == set(names + shadows)
  # Each shadow starts from its variable's value, not the source's shadow.
  assert settings.var_name_to_prev_var_name == dict(zip(shadows, names))


def without(shapes, scope):
  return {name: shape for name, shape in shapes.items()
          if not name.startswith(scope)}


def test_another_class_count_not_excluded_names_the_shapes_and_the_flag(
    tmp_path):
  shapes = {**LENET_SHAPES, "LeNet/fc4/weights": (512, 12),
            "LeNet/fc4/biases": (12,)}
  checkpoint = save_checkpoint(str(tmp_path / "model.ckpt-1"), shapes)
  with pytest.raises(ValueError) as error:
    fine_tune_plan(tmp_path, checkpoint)
  message = str(error.value)
  assert "LeNet/fc4/weights: [512, 12] in the checkpoint, [512, 10] in " \
      "the net" in message
  assert "LeNet/fc4/biases: [12] in the checkpoint, [10] in the net" in message
  assert "--checkpoint_exclude_scopes=LeNet/fc4" in message


def test_a_missing_variable_is_an_error_naming_it_and_the_flags(tmp_path):
  checkpoint = save_checkpoint(str(tmp_path / "model.ckpt-1"),
                               without(LENET_SHAPES, "LeNet/fc3"))
  with pytest.raises(ValueError, match=(
      r"lacks 2 variable\(s\) of the net: LeNet/fc3/weights, "
      r"LeNet/fc3/biases .* --checkpoint_exclude_scopes=LeNet/fc3, or pass "
      r"--ignore_missing_vars")):
    fine_tune_plan(tmp_path, checkpoint)


def test_ignore_missing_vars_skips_them_with_a_log_line(tmp_path, caplog):
  checkpoint = save_checkpoint(str(tmp_path / "model.ckpt-1"),
                               without(LENET_SHAPES, "LeNet/fc3"))
  caplog.set_level("INFO")
  _, settings = fine_tune_plan(tmp_path, checkpoint, ignore_missing=True)
  assert "LeNet/fc3/weights, LeNet/fc3/biases" in caplog.text
  restored = {name for name in LENET_SHAPES
              if any(re.match(pattern, name + ":0")
                     for pattern in settings.vars_to_warm_start)}
  assert restored == set(without(LENET_SHAPES, "LeNet/fc3"))


@pytest.mark.parametrize("ignore_missing", [False, True])
def test_another_nets_checkpoint_is_one_message(tmp_path, ignore_missing):
  # Issue 54: without --ignore_missing_vars this was "lacks 8 variable(s)
  # ... Exclude them with --checkpoint_exclude_scopes=...", whose advice
  # led to a second error.
  checkpoint = save_checkpoint(str(tmp_path / "model.ckpt-1"),
                               {"MLP/fc1/weights": (64, 10)})
  with pytest.raises(ValueError) as error:
    fine_tune_plan(tmp_path, checkpoint, ignore_missing=ignore_missing)
  assert re.search(
      r"--checkpoint_path=\S+ is another net's: it holds none of the 8 "
      r"variables of the net --model_name builds \(LeNet/conv1/weights, .*"
      r"; it holds MLP/fc1/weights\)\. Give a checkpoint of that net",
      str(error.value)), str(error.value)
  assert "exclude" not in str(error.value)


def test_all_variables_excluded_is_an_error(tmp_path):
  checkpoint = save_checkpoint(str(tmp_path / "model.ckpt-1"), LENET_SHAPES)
  with pytest.raises(ValueError, match="holds none of the variables to "
                     "restore .*all excluded"):
    fine_tune_plan(tmp_path, checkpoint, exclude=["LeNet"])


@pytest.mark.parametrize("path,expected", [
    ("nowhere/model.ckpt-5", r"nowhere/model.ckpt-5 is not a checkpoint: "
     r"nowhere/model.ckpt-5.index does not exist"),
    ("{src}/model.ckpt-1.index", r"directory holding checkpoints; here: "
     r".*/src/model.ckpt-1\."),
    ("{empty}", r"is a directory without a checkpoint"),
], ids=["nowhere", "index_file", "empty_dir"])
def test_a_bad_checkpoint_path_says_what_a_checkpoint_is(tmp_path, path,
                                                         expected):
  save_checkpoint(str(tmp_path / "src" / "model.ckpt-1"), LENET_SHAPES)
  (tmp_path / "empty").mkdir()
  path = path.format(src=tmp_path / "src", empty=tmp_path / "empty")
  with pytest.raises(FileNotFoundError, match=expected):
    fine_tune_plan(tmp_path, path)


@pytest.mark.parametrize("flag_values,expected", [
    ({"exclude": ["LeNet/logits"]}, r"--checkpoint_exclude_scopes: "
     r"'LeNet/logits' matches no variable of the net; expected one of its "
     r"scopes: LeNet/conv1, LeNet/conv2, LeNet/fc3, LeNet/fc4 "),
    ({"trainable": ["Lenet/fc4"]}, r"--trainable_scopes: 'Lenet/fc4' "
     r"matches no variable"),
], ids=["exclude", "trainable"])
def test_a_scope_that_matches_nothing_is_an_error(tmp_path, flag_values,
                                                  expected):
  checkpoint = save_checkpoint(str(tmp_path / "model.ckpt-1"), LENET_SHAPES)
  with pytest.raises(ValueError, match=expected):
    fine_tune_plan(tmp_path, checkpoint, **flag_values)


def test_restore_flags_without_checkpoint_path_are_an_error(tmp_path):
  with pytest.raises(ValueError, match=r"--checkpoint_exclude_scopes is "
                     r"given, but .* drop --checkpoint_exclude_scopes"):
    fine_tune_plan(tmp_path, None, exclude=[LOGITS])


def test_a_resume_ignores_checkpoint_path_with_an_info_line(tmp_path, caplog):
  model_dir = tmp_path / "new"
  save_checkpoint(str(model_dir / "model.ckpt-7"), LENET_SHAPES)
  caplog.set_level("INFO")
  config, settings = fine_tune_plan(tmp_path, "nowhere/model.ckpt-5")
  assert settings is None and config.trainable_scopes == ()
  assert (f"Ignoring --checkpoint_path=nowhere/model.ckpt-5: --model_dir="
          f"{model_dir} already has a checkpoint") in caplog.text


def test_trainable_scopes_are_recorded_and_kept_on_a_resume(tmp_path):
  model_dir = str(tmp_path / "new")
  save_checkpoint(os.path.join(model_dir, "model.ckpt-7"), LENET_SHAPES)
  record = run_config.RunRecord(
      classifier=lenet_config(10, trainable_scopes=[LOGITS]), image_size=8,
      dataset_name="digits")
  run_config.write(model_dir, record)
  recorded = run_config.read(model_dir)
  assert recorded == record and recorded.classifier.trainable_scopes == (
      LOGITS,)
  # Resumed without --trainable_scopes:
  assert fine_tuning.trainable_scopes(None, recorded, model_dir) == (LOGITS,)
  # --trainable_scopes= : train every variable.
  assert fine_tuning.trainable_scopes((), recorded, model_dir) == ()


class CountRuns(tf1.train.SessionRunHook):
  """Counts the session runs of the eval loop (one per batch)."""

  def __init__(self):
    self.count = 0

  def after_run(self, run_context, run_values):
    self.count += 1


@pytest.mark.parametrize("max_batches", [2, None])
def test_eval_max_num_batches_runs_at_most_that_many(source, max_batches):
  eval_batch = 64
  config = lenet_config(SOURCE_CLASSES)
  towers = towers_lib.resolve_towers(None, None, 2)
  estimator = eval_script.build_estimator(towers, config, source, True)
  input_fn = datasets.make_input_fn("digits", "eval", eval_batch)
  counter = CountRuns()
  metrics = eval_script.evaluate(
      estimator, input_fn, os.path.join(source, f"model.ckpt-{SOURCE_STEPS}"),
      None, max_batches, hooks=[counter])
  # The whole split is ceil(examples / 64) batches (the last one partial).
  whole = math.ceil(len(datasets.load_digits_split("eval")[1]) / eval_batch)
  assert whole > 2
  assert counter.count == (max_batches or whole)
  assert metrics["global_step"] == SOURCE_STEPS


def test_eval_checkpoint_path_picks_one_checkpoint_and_its_model_dir(
    tmp_path):
  first = save_checkpoint(str(tmp_path / "run" / "model.ckpt-1"),
                          LENET_SHAPES)
  latest = save_checkpoint(str(tmp_path / "run" / "model.ckpt-2"),
                           LENET_SHAPES)
  run_dir = str(tmp_path / "run")
  assert eval_script.checkpoint_and_model_dir(first, "runs/digits", False) \
      == (first, run_dir)
  assert eval_script.checkpoint_and_model_dir(run_dir, "runs/digits", False) \
      == (latest, run_dir)
  assert eval_script.checkpoint_and_model_dir(first, "elsewhere", True) == (
      first, "elsewhere")
  assert eval_script.checkpoint_and_model_dir(None, "elsewhere", False) == (
      None, "elsewhere")
  with pytest.raises(FileNotFoundError, match="is not a checkpoint"):
    eval_script.checkpoint_and_model_dir(first + "0", "runs/digits", False)


@pytest.mark.parametrize("bad", [0, -3])
def test_eval_max_num_batches_must_be_positive(bad):
  with pytest.raises(flags.IllegalFlagValueError,
                     match="expected a number of batches > 0"):
    FLAGS.max_num_batches = bad



@pytest.mark.slow
def test_scripts_fine_tune_a_new_class_count_then_evaluate_one_checkpoint(
    tmp_path):
  data = ["--model_name=lenet", "--dataset_name=synthetic", "--image_size=8",
          "--batch_size=8", "--virtual_cpus=2"]
  source, target = str(tmp_path / "source"), str(tmp_path / "target")
  # A LeNet of 12 classes on 8x8 RGB images (synthetic data has 3 channels).
  save_checkpoint(os.path.join(source, "model.ckpt-4"), {
      **LENET_SHAPES, "LeNet/conv1/weights": (5, 5, 3, 32),
      "LeNet/fc4/weights": (512, 12), "LeNet/fc4/biases": (12,)})
  tuned = run_script(
      "train.py", *data, "--num_classes=5", "--max_steps=3",
      f"--model_dir={target}", f"--checkpoint_path={source}",
      f"--checkpoint_exclude_scopes={LOGITS}", f"--trainable_scopes={LOGITS}")
  # LeNet has 4 layers of weights and biases; the 2 of fc4 are excluded.
  assert (f"Fine-tuning from {source}/model.ckpt-4: 6 of the net's 8 "
          "variables restored; fresh: LeNet/fc4/weights, LeNet/fc4/biases"
          in tuned.stderr)
  assert run_config.read(target).classifier.trainable_scopes == (LOGITS,)
  for name in names_under(FROZEN + TRAINED):  # frozen at the source's value.
    np.testing.assert_array_equal(
        value(os.path.join(target, "model.ckpt-3"), name),
        value(os.path.join(source, "model.ckpt-4"), name))
  evaluated = run_script("eval.py", f"--checkpoint_path={target}",
                         "--max_num_batches=2")
  assert "global_step=3" in evaluated.stdout.strip().splitlines()[-1]


def test_classifier_trainable_scopes_are_checked_in_the_model_fn():
  with pytest.raises(TypeError, match="`trainable_scopes` is the string "
                     "'LeNet/fc4'; expected a sequence of scopes"):
    lenet_config(10, trainable_scopes="LeNet/fc4")
  with tf.Graph().as_default():
    weights = tf1.get_variable("LeNet/fc4/weights", [2])
    tf1.get_variable("LeNet/fc3/weights", [2])
    assert classifier.variables_to_train(()) is None  # all train.
    assert classifier.variables_to_train(("LeNet/fc4",)) == [weights]
    with pytest.raises(ValueError, match=r"\['fc4'\] match no trainable "
                       "variable; .* such as LeNet/fc4/weights, "
                       "LeNet/fc3/weights"):
      classifier.variables_to_train(("fc4",))
