"""train.py and eval.py: their functions on tiny data, and one real run."""

import glob
import os
import re
import subprocess
import sys

from absl import flags
import numpy as np
import pytest
from script_runs import run_script
import tensorflow as tf

from estimator_multigpu.runtime import evaluation

import classifier
from cli import run_estimator
from cli import run_plan
from cli import run_setup
from cli import towers as towers_lib
from cli.flags import definitions as cli_flags
from cli.flags import optimization
import eval as eval_script
import train

tf1 = tf.compat.v1
FLAGS = flags.FLAGS
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


pytestmark = pytest.mark.usefixtures("parsed_flags")


def test_towers_default_to_two_virtual_cpus_without_gpus():
  towers = towers_lib.resolve_towers(None, None, None)
  assert towers.devices == ["/device:CPU:0", "/device:CPU:1"]
  assert towers.session_config.device_count["CPU"] == 2


def test_towers_from_devices_and_virtual_cpus():
  if len(tf.config.list_physical_devices("GPU")) >= 4:
    assert towers_lib.resolve_towers(None, ["/gpu:1", "/gpu:3"],
                                       None).devices == ["/device:GPU:1",
                                                         "/device:GPU:3"]
  else:  # refused at once in the script's words (issue 44).
    with pytest.raises(ValueError, match="give --num_gpus=N for the first"):
      towers_lib.resolve_towers(None, ["/gpu:1", "/gpu:3"], None)
  assert len(towers_lib.resolve_towers(None, None, 3).devices) == 3
  with pytest.raises(ValueError, match="--num_gpus and --virtual_cpus both"):
    towers_lib.resolve_towers(2, None, 3)


@pytest.mark.parametrize("decay_type,expected", [
    # base 0.1, 10 warm-up steps, decay over 100 steps, at global step 60:
    # 50 steps into the decay.
    ("fixed", 0.1),
    ("exponential", 0.1 * 0.5 ** (50 / 100)),
    ("polynomial", (0.1 - 0.01) * (1 - 50 / 100) + 0.01),
    ("cosine", 0.01 + 0.5 * (0.1 - 0.01) * (1 + np.cos(np.pi * 50 / 100)))])
def test_learning_rate_schedules(decay_type, expected):
  config = classifier.ClassifierConfig(
      learning_rate=0.1, learning_rate_decay_type=decay_type,
      decay_steps=100, decay_rate=0.5, end_learning_rate=0.01,
      warmup_steps=10)
  with tf.Graph().as_default(), tf1.Session() as session:
    step = tf1.placeholder(tf.int64, [])
    rate = classifier.learning_rate(config, step)
    np.testing.assert_allclose(session.run(rate, {step: 60}), expected,
                               rtol=1e-5)
    # Warm-up: step 4 of 10 runs at 5/10 of the base rate.
    np.testing.assert_allclose(session.run(rate, {step: 4}), 0.05, rtol=1e-5)


def test_bad_classifier_config_names_the_flag():
  with pytest.raises(ValueError, match="`optimizer` is 'lamb'; expected one "
                     "of sgd, momentum, adam, rmsprop"):
    classifier.ClassifierConfig(optimizer="lamb")
  with pytest.raises(ValueError, match="Unknown network `resnet`"):
    classifier.ClassifierConfig(model_name="resnet")


@pytest.mark.parametrize("variable_update", ["shared", "replicated"])
def test_train_then_evaluate_in_process(variable_update, tmp_path):
  FLAGS.model_name, FLAGS.max_steps, FLAGS.batch_size = "mlp", 20, 16
  towers = towers_lib.resolve_towers(None, None, 2)
  settings = cli_flags.read(train.Settings)
  config = optimization.classifier_config(settings, 10)
  model_fn = run_estimator.build_model_fn(towers, 0.9, None, 16, 20, 10,
                                          str(tmp_path),
                                          variable_update=variable_update)
  estimator = run_estimator.build_estimator(model_fn, config, towers,
                                            str(tmp_path), 10, 10, 1)
  digits = run_setup.ModelSetup("mlp", 10, 8, "digits", None,
                                dataset_split_name="train",
                                preprocessing_name="resize")
  estimator.train(run_plan.train_input_fn(settings, digits), max_steps=20)
  checkpoint = tf.train.latest_checkpoint(str(tmp_path))
  assert checkpoint.endswith("model.ckpt-20")
  assert eval_script.checkpoint_has_ema(checkpoint)
  evaluator = eval_script.build_estimator(towers, config, str(tmp_path), True)
  input_fn = eval_script.datasets.make_input_fn("digits", "eval", 64)
  metrics = eval_script.evaluate(evaluator, input_fn, checkpoint, 6)
  assert metrics["global_step"] == 20
  assert 0.0 <= metrics["accuracy"] <= 1.0 and "top_5" in metrics
  line = evaluation.format_metrics(metrics)
  assert line.startswith("accuracy=") and " global_step=20 " in line


def scalar_tags(directory):
  tags = set()
  for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
    for event in tf1.train.summary_iterator(path):
      tags.update(value.tag for value in event.summary.value)
  return tags



STDERR_CEILING = 25  # lines of a 30-step train.py run (was 129).


def progress_lines(stderr):
  return [line for line in stderr.splitlines() if "] step " in line]


@pytest.mark.slow
def test_train_eval_export_serve_with_model_dir_alone(tmp_path):
  model_dir = str(tmp_path / "run")
  trained = run_script("train.py", "--model_name=mlp",
                       f"--model_dir={model_dir}", "--max_steps=30",
                       "--save_summary_steps=10")
  assert os.path.exists(os.path.join(model_dir, "model.ckpt-30.index"))
  assert os.path.exists(os.path.join(model_dir, "run_config.json"))
  assert {"loss", "learning_rate", "gradient_global_norm",
          "tower_loss/tower_0", "tower_loss/tower_1", "examples_per_sec",
          "examples_per_sec_per_tower"} <= scalar_tags(model_dir)
  # Quiet: no deprecation or C++ noise, every line once, mostly progress.
  lines = trained.stderr.splitlines()
  assert len(lines) <= STDERR_CEILING, trained.stderr
  assert len(progress_lines(trained.stderr)) >= len(lines) // 2
  assert len(progress_lines(trained.stderr)) >= 9  # every 3 of 30 steps.
  first = progress_lines(trained.stderr)[0]  # after the first step (#44).
  assert re.search(r"\] step [01]  loss .*  first step ", first), first
  assert "ETA at most" in first
  for noise in ("deprecated", "INFO:tensorflow", "cpu_feature_guard",
                "Instructions for updating"):
    assert noise not in trained.stderr
  assert len(set(lines)) == len(lines)
  assert "Next: python eval.py --model_dir=" in lines[-1]

  # eval.py with --model_dir alone: the recorded net and data, and the
  # continuous mode stops after the recorded last step (no --once).
  evaluated = run_script("eval.py", f"--model_dir={model_dir}")
  last = evaluated.stdout.strip().splitlines()[-1]
  assert last.startswith("accuracy=") and "global_step=30" in last
  assert len(evaluated.stderr.splitlines()) <= 6, evaluated.stderr
  # Quiet and true (issue 44): no C++ teardown line at the end of the data
  # (TF 2.21's "Local rendezvous is aborting"), metrics as plain numbers.
  assert "rendezvous" not in evaluated.stderr.lower()
  assert "np.float" not in evaluated.stderr
  assert re.search(r"Evaluated \S+model.ckpt-30: accuracy=0\.\d{4} "
                   r"global_step=30 loss=", evaluated.stderr)
  assert {"accuracy", "loss", "top_5"} <= scalar_tags(
      os.path.join(model_dir, "eval"))

  # export.py with --model_dir alone; the SavedModel takes raw pixels.
  exported = run_script("export.py", f"--model_dir={model_dir}",
                        f"--export_dir={tmp_path / 'export'}")
  served = serve_digits(exported.stdout.strip().splitlines()[-1])
  accuracy = float(last.split("accuracy=")[1].split()[0])
  assert served == pytest.approx(accuracy, abs=1e-4)

  # A resume that moves the schedule says so and how to keep it; the net
  # comes from the record (no --model_name).
  # Decay steps default to max_steps - 50 warm-up steps, at least 1: 30
  # steps recorded 1, 80 steps give 30.
  resumed = run_script("train.py", f"--model_dir={model_dir}",
                       "--max_steps=80")
  assert ("another learning-rate schedule than it recorded: decay_steps "
          "1 -> 30") in resumed.stderr
  assert "To keep the recorded schedule, pass --decay_steps=1." in (
      resumed.stderr)
  assert "Training mlp on digits" in resumed.stderr
  assert "model.ckpt-30" in resumed.stderr  # where it resumed from.


def serve_digits(saved_model):
  """Accuracy of a SavedModel on the held-out digits, fed raw pixels."""
  code = (
      "import sys, numpy as np, tensorflow as tf, datasets\n"
      "images, labels = datasets.load_digits_split('eval')\n"
      "serve = tf.saved_model.load(sys.argv[1]).signatures[\n"
      "    'float:serving_default']  # raw digits, 0..16 floats.\n"
      "raw = tf.constant(images.reshape(-1, 8, 8, 1).astype('float32'))\n"
      "print((serve(images=raw)['classes'].numpy() == labels).mean())\n")
  result = subprocess.run([sys.executable, "-c", code, saved_model],
                          capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
  assert result.returncode == 0, result.stderr[-3000:]
  return float(result.stdout.strip().splitlines()[-1])
