"""Issue 35's data rows, through the scripts' entry points: the checks of
the data a run reads against its flags and its model (cli/data/), each one
line on stderr with exit status 2, before anything is written to the model
dir; and the converter and the example as quiet as the scripts."""

import os
import re
import shutil
import subprocess
import sys

import bad_inputs as bad
import pytest
import tensorflow as tf
from test_mistakes import ROOT
from test_mistakes import run_in_process
from test_mistakes import the_error_line

from cli.data import checks
from cli.model_dir import run_config

pytestmark = pytest.mark.usefixtures("parsed_flags")


def records(folder: str, classes_listed: int, example=None) -> str:
  """A 4-record split whose labels.txt lists `classes_listed` classes;
  `example`: the records' tf.train.Example (default: the converter's)."""
  path = bad.write_records(folder, [(bad.png(), k % 2) for k in range(4)],
                           classes=classes_listed)
  if example is not None:
    with tf.io.TFRecordWriter(path) as writer:
      for _ in range(4):
        writer.write(example.SerializeToString())
  return path


def train_on_records(tmp_path, *flags) -> int:
  return run_in_process("train", [
      "--dataset_name=tfrecord", f"--dataset_dir={tmp_path}/data",
      "--image_size=8", "--batch_size=2", "--max_steps=1",
      f"--model_dir={tmp_path}/model", *flags])


def written(model_dir: str) -> list:
  """What a run left in its model dir (the lock is taken and released)."""
  return sorted(os.listdir(model_dir)) if os.path.isdir(model_dir) else []


# ------------------------------------- row 1: --num_classes vs the records


def test_num_classes_other_than_the_records_is_refused(tmp_path, capsys):
  records(f"{tmp_path}/data", classes_listed=4)
  assert train_on_records(tmp_path, "--num_classes=6") == 2
  line = the_error_line(capsys.readouterr().err, "train")
  assert line == (
      f"train.py: error: --num_classes=6 but the records in --dataset_dir="
      f"{tmp_path}/data have 4 classes ({tmp_path}/data/labels.txt lists "
      "4); drop --num_classes (it is read from that file) or give "
      "--num_classes=4.")
  assert written(f"{tmp_path}/model") == []


def test_num_classes_counts_the_labels_offset(tmp_path):
  records(f"{tmp_path}/data", classes_listed=4)
  data = str(tmp_path / "data")
  checks.check_num_classes(3, "tfrecord", data, labels_offset=1)  # 4 - 1.
  with pytest.raises(ValueError, match=re.escape(
      "lists 4, minus --labels_offset=1 is 3); drop --num_classes (it is "
      "read from that file) or give --num_classes=3.")):
    checks.check_num_classes(4, "tfrecord", data, labels_offset=1)
  checks.check_num_classes(6, "synthetic", None)  # no labels file: any.
  checks.check_num_classes(6, "tfrecord", str(tmp_path))  # none there.


# ------------------------------------ row 3: records with other features


def test_records_with_other_features_refused_before_the_model_dir(
    tmp_path, capsys):
  other = tf.train.Example(features=tf.train.Features(feature={
      "image/raw": tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[bad.png()])),
      "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[1]))}))
  path = records(f"{tmp_path}/data", classes_listed=2, example=other)
  assert train_on_records(tmp_path) == 2
  line = the_error_line(capsys.readouterr().err, "train")
  assert line.startswith(
      f"train.py: error: Record file {path} holds 'image/raw' (bytes), "
      "'label' (int64), but the reader needs 'image/class/label' (int64) "
      "and 'image/encoded' (bytes): ")
  assert written(f"{tmp_path}/model") == []  # no step-0 checkpoint, no
  # run_config.json (today both were left behind).


# ------------------------------ row 4: 3-channel data on a 1-channel model


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
  """A digits (1-channel) lenet at step 1, and a copy without its record."""
  model_dir = str(tmp_path_factory.mktemp("digits") / "model")
  assert run_in_process("train", [f"--model_dir={model_dir}",
                                  "--max_steps=1", "--batch_size=8"]) == 0
  bare = str(tmp_path_factory.mktemp("bare") / "model")
  shutil.copytree(model_dir, bare)
  os.remove(run_config.path(bare))
  return model_dir, bare


def test_eval_names_the_channels_of_data_and_model(digits_model, capsys):
  model_dir, _ = digits_model
  assert run_in_process("eval", [f"--model_dir={model_dir}", "--once",
                                 "--dataset_name=synthetic"]) == 2
  line = the_error_line(capsys.readouterr().err, "eval")
  assert line == (
      "eval.py: error: --dataset_name=synthetic gives 3-channel images but "
      f"--model_dir={model_dir} holds a model trained on 1-channel images "
      f"(dataset digits, {model_dir}/run_config.json): its first layer "
      "takes 1 channel(s). Use 1-channel data (--dataset_name=digits), or "
      "choose another --model_dir.")
  assert "image_size" not in line


def test_without_a_record_the_checkpoint_names_the_channels(digits_model,
                                                            capsys):
  _, bare = digits_model
  assert run_in_process("eval", [
      f"--model_dir={bare}", "--once", "--dataset_name=synthetic",
      "--image_size=8", "--num_classes=10", "--model_name=lenet"]) == 2
  line = the_error_line(capsys.readouterr().err, "eval")
  assert ("for 1-channel images (LeNet/conv1/weights is [5, 5, 1, 32]); "
          "this run reads 3-channel images ([5, 5, 3, 32]: another "
          "--dataset_name?)") in line
  assert "image_size" not in line


def test_channels_of_each_dataset():
  # digits are grayscale; synthetic and records are decoded to RGB.
  assert [checks.channels(name) for name in ("digits", "synthetic",
                                             "tfrecord")] == [1, 3, 3]


# --------------------------------------------- row 8: the example is quiet


@pytest.mark.slow
def test_quickstart_example_prints_its_own_lines_only(tmp_path):
  result = subprocess.run(
      [sys.executable, "examples/quickstart.py"], cwd=ROOT,
      capture_output=True, text=True, timeout=300, check=False,
      env={**os.environ, "TMPDIR": str(tmp_path)})
  assert result.returncode == 0, result.stderr[-2000:]
  # stderr: the plan of train and of eval, the accuracy (186 lines of
  # TensorFlow logs before; issue 44: no temporary-folder WARNING, no C++
  # rendezvous line at the end of the held-out data).
  lines = result.stderr.splitlines()
  assert len(lines) == 3, lines
  assert "multi_gpu train: 2 towers" in lines[0]
  assert "multi_gpu eval: 2 towers" in lines[1]
  assert "held-out accuracy" in lines[2]
  assert re.fullmatch(r"accuracy=0\.\d{4} global_step=400\n", result.stdout)
  assert os.listdir(tmp_path) == []  # its model dir is removed (was 5 MB).
