"""The model_dir remembers its run; quiet-log and batch-norm helpers."""

import json
import os

from absl import flags
import pytest
import tensorflow as tf

import classifier
from cli import run_estimator
from cli import run_setup
from cli import script_logging
from cli import settings as settings_lib
from cli import towers as towers_lib
from cli.flags import advice as run_advice
from cli.flags import definitions as cli_flags
from cli.flags import optimization
from cli.model_dir import run_config
from cli.model_dir import run_record
import datasets
import train

FLAGS = flags.FLAGS
tf1 = tf.compat.v1


pytestmark = pytest.mark.usefixtures("parsed_flags")


def give(**values):
  """Sets flags as if given on the command line."""
  for name, value in values.items():
    setattr(FLAGS, name, value)
    FLAGS[name].present = 1


def model_setup(model_dir):
  """`run_setup.model_setup` with the model and data settings of the flags."""
  return run_setup.model_setup(model_dir,
                               cli_flags.read(settings_lib.ModelSettings),
                               cli_flags.read(settings_lib.DataSettings))


def recorded_max_steps(record):
  return run_setup.recorded_max_steps(record, FLAGS.max_steps,
                                      bool(FLAGS["max_steps"].present))


def a_record(**classifier_fields):
  config = classifier.ClassifierConfig(
      model_name="mlp", num_classes=7, learning_rate_decay_type="cosine",
      decay_steps=80, warmup_steps=20, **classifier_fields)
  return run_config.RunRecord(
      classifier=config, image_size=12, dataset_name="synthetic",
      preprocessing=datasets.preprocessing("synthetic"), max_steps=100,
      global_batch_size=8, towers=("/device:CPU:0", "/device:CPU:1"),
      options={"moving_average_decay": 0.99})


def test_record_round_trips_through_the_model_dir(tmp_path):
  record = a_record()
  path = run_config.write(str(tmp_path), record)
  assert path == os.path.join(str(tmp_path), "run_config.json")
  assert run_config.read(str(tmp_path)) == record
  data = json.loads(open(path).read())
  assert data["classifier"]["model_name"] == "mlp"
  assert data["preprocessing"] == {"channels": 3, "pixel_scale": 1.0,
                                   "resize": "bilinear"}


def test_unknown_keys_of_a_newer_record_are_ignored(tmp_path):
  data = json.loads(a_record().to_json())
  data["from_the_future"] = 1
  data["classifier"]["new_option"] = True
  (tmp_path / "run_config.json").write_text(json.dumps(data))
  assert run_config.read(str(tmp_path)) == a_record()


def test_no_record_and_a_broken_one(tmp_path):
  assert run_config.read(str(tmp_path)) is None
  (tmp_path / "run_config.json").write_text("{not json")
  with pytest.raises(ValueError, match="cannot be read.*fix or delete it"):
    run_config.read(str(tmp_path))


def test_model_dir_alone_gives_the_recorded_model_and_data(tmp_path):
  run_config.write(str(tmp_path), a_record())
  setup = model_setup(str(tmp_path))
  assert (setup.model_name, setup.num_classes, setup.image_size,
          setup.dataset_name) == ("mlp", 7, 12, "synthetic")
  assert setup.classifier_config() == a_record().classifier
  assert recorded_max_steps(setup.record) == 100
  give(max_steps=250, image_size=16)  # flags override the record...
  setup = model_setup(str(tmp_path))
  assert setup.image_size == 16
  assert recorded_max_steps(setup.record) == 250


@pytest.mark.parametrize("flag,value,recorded", [
    ("model_name", "lenet", "mlp"), ("num_classes", 10, 7)])
def test_a_net_other_than_the_recorded_one_is_a_clear_error(
    tmp_path, flag, value, recorded):
  run_config.write(str(tmp_path), a_record())
  give(**{flag: value})  # ...except the net and its classes.
  with pytest.raises(ValueError, match=(
      f"--{flag}={value} but --model_dir={tmp_path} holds checkpoints of "
      f"{flag}={recorded}.*Drop --{flag}")):
    model_setup(str(tmp_path))


def test_without_a_record_the_flags_decide(tmp_path):
  setup = model_setup(str(tmp_path))
  assert setup.record is None and setup.model_name == FLAGS.model_name
  assert setup.classifier_config().model_name == FLAGS.model_name


def test_a_changed_schedule_says_what_changed_and_how_to_keep_it():
  old = a_record().classifier
  new = classifier.ClassifierConfig(**{**old.__dict__, "decay_steps": 180})
  changes = run_config.schedule_changes(old, new)
  assert changes == [("decay_steps", 80, 180)]
  # Cosine from 0.05 to 0 over 80 steps after 20 of warm-up, at step 100:
  # the recorded schedule has ended (0.0); the new one is 80 of 180 steps
  # in: 0.025 * (1 + cos(pi * 80 / 180)).
  rates = (run_record.learning_rate_at(old, 100), run_record.learning_rate_at(new, 100))
  assert rates[0] == pytest.approx(0.0, abs=1e-7)
  assert rates[1] == pytest.approx(0.025 * (1 + 0.17364818), rel=1e-5)
  message = run_config.schedule_change_message(changes, 100, rates)
  assert "decay_steps 80 -> 180" in message
  assert "moves from 0 to 0.02934" in message
  assert message.endswith("To keep the recorded schedule, pass "
                          "--decay_steps=80.")


def test_train_records_what_eval_and_export_need(tmp_path):
  FLAGS.model_name, FLAGS.max_steps, FLAGS.batch_size = "mlp", 40, 16
  FLAGS.model_dir = str(tmp_path)
  settings = cli_flags.read(train.Settings)
  towers = towers_lib.resolve_towers(None, None, 2)
  setup = model_setup(str(tmp_path))
  config = optimization.classifier_config(settings, setup.num_classes, 0,
                                   setup.model_name)
  run_record.record_run(setup, config, towers, settings)
  record = run_config.read(str(tmp_path))
  assert record.classifier == config and record.max_steps == 40
  assert record.image_size == 8 and record.dataset_name == "digits"
  assert record.preprocessing["pixel_scale"] == 1 / 16
  assert record.towers == ("/device:CPU:0", "/device:CPU:1")
  assert record.global_batch_size == 16
  assert record.options["random_seed"] == FLAGS.random_seed


@pytest.mark.parametrize("flag_value,max_steps,expected", [
    (None, 30, 3), (None, 1500, 100), (None, 5, 1), (7, 30, 7)])
def test_progress_every_tenth_of_a_short_run(flag_value, max_steps, expected):
  assert run_estimator.log_every_n_steps(flag_value, max_steps) == expected


@pytest.mark.parametrize("argv,verbosity", [
    (["train.py"], 0), (["train.py", "--verbosity=1"], 1),
    (["train.py", "-v", "2"], 2), (["train.py", "--verbosity", "-1"], -1),
    (["train.py", "--", "--verbosity=1"], 0)])
def test_verbosity_is_read_before_tensorflow(argv, verbosity):
  assert script_logging.verbosity_from_argv(argv) == verbosity


@pytest.mark.parametrize("batch,towers,sync,fragment", [
    (4, 2, False, "the per-tower batch (global batch 4 over 2 towers) is 2 "
     "examples"),
    (64, 2, False, None),
    (16, 4, False, "Pass --sync_batch_norm to normalize over the global "
     "batch (16 examples)"),
    (16, 4, True, None),
    (8, 2, True, "the global batch (--sync_batch_norm) is 8 examples"),
    (8, 1, False, "Raise --batch_size to at least 16 (16 per tower)"),
])
def test_batch_norm_advice_names_the_per_tower_batch(batch, towers, sync,
                                                     fragment):
  advice = run_advice.small_batch_norm_advice(batch, towers, sync)
  if fragment is None:
    assert advice is None
  else:
    assert fragment in advice
    assert "per-tower" in advice or sync
    # With one tower, synchronizing would not help: it is not offered.
    assert ("--sync_batch_norm" in advice) == (towers > 1)


def test_batch_norm_warning_on_any_device_only_for_batch_norm_nets():
  with tf.Graph().as_default() as graph:
    images = tf1.placeholder(tf.float32, [None, 8, 8, 3])
    tf1.layers.dense(images, 4)
    assert run_advice.warn_small_batch_norm(graph, 4, 2) is None
    tf1.layers.batch_normalization(images, training=True)
    assert run_advice.has_batch_norm(graph)
    assert "2 examples" in run_advice.warn_small_batch_norm(graph, 4, 2)
