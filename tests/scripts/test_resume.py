"""Issue 35, row "resume a model dir with another --dataset_dir": a resumed
train.py goes on with the recorded net and data (cli/model_dir/resume.py).

Given and different, the net or the data is refused before anything is
written (run_config.json keeps its bytes, no checkpoint moves); the
schedule may change, with one INFO line. Through train.py's entry point, in
this process; one refusal also as a real process (slow).
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

from absl import logging
import bad_inputs as bad
import pytest
import tensorflow as tf
from test_mistakes import ROOT
from test_mistakes import run_in_process
from test_mistakes import the_error_line

from cli import run_setup
from cli.model_dir import resume
from cli.model_dir import run_config

pytestmark = pytest.mark.usefixtures("parsed_flags")
SMALL = ["--model_name=lenet", "--image_size=8", "--batch_size=2"]


def records(folder: str, classes: int) -> str:
  """8 PNG records of `classes` classes (labels 0, 1, ..., in turn)."""
  bad.write_records(folder, [(bad.png(), k % classes) for k in range(8)],
                    classes=classes)
  return folder


@pytest.fixture(scope="module")
def four_class_run(tmp_path_factory):
  """A lenet trained 2 steps on 4-class records; and 2-class records."""
  root = tmp_path_factory.mktemp("resume")
  data = {"four": records(str(root / "four"), 4),
          "two": records(str(root / "two"), 2)}
  model_dir = str(root / "run")
  assert run_in_process("train", [
      f"--model_dir={model_dir}", "--dataset_name=tfrecord",
      f"--dataset_dir={data['four']}", *SMALL, "--max_steps=2"]) == 0
  return {"model_dir": model_dir, **data}


@pytest.fixture
def run(four_class_run, tmp_path):
  """A copy of the trained run, for a test to resume."""
  model_dir = str(tmp_path / "run")
  shutil.copytree(four_class_run["model_dir"], model_dir)
  return {**four_class_run, "model_dir": model_dir}


def snapshot(model_dir: str) -> tuple:
  with open(os.path.join(model_dir, "run_config.json"), "rb") as f:
    return f.read(), tf.train.latest_checkpoint(model_dir)


@pytest.mark.parametrize("flag,given,recorded", [
    ("dataset_dir", "{two}", "{four}"),
    ("dataset_name", "synthetic", "tfrecord"),
    ("image_size", "10", "8"),
])
def test_other_data_on_resume_is_refused_naming_both_values(
    run, flag, given, recorded, capsys):
  given, recorded = given.format(**run), recorded.format(**run)
  before = snapshot(run["model_dir"])
  status = run_in_process("train", [
      f"--model_dir={run['model_dir']}", "--batch_size=2", "--max_steps=4",
      f"--{flag}={given}"])
  line = the_error_line(capsys.readouterr().err, "train")
  assert status == 2, line
  assert (f"--{flag}={given} but --model_dir={run['model_dir']} was "
          f"trained with {flag}={recorded}") in line
  assert f"Drop --{flag} to resume with {recorded}" in line
  assert (f"a new --model_dir (add --checkpoint_path={run['model_dir']} to "
          "start from its weights)") in line
  assert snapshot(run["model_dir"]) == before  # record and step unchanged.


def test_other_channels_than_recorded_are_refused(run, capsys):
  # A record whose images had 1 channel (as digits do); tfrecord gives 3.
  path = os.path.join(run["model_dir"], "run_config.json")
  with open(path) as f:
    record = json.load(f)
  record["preprocessing"]["channels"] = 1
  with open(path, "w") as f:
    json.dump(record, f)
  status = run_in_process("train", [f"--model_dir={run['model_dir']}",
                                    "--batch_size=2", "--max_steps=4"])
  line = the_error_line(capsys.readouterr().err, "train")
  assert status == 2 and ("--dataset_name=tfrecord gives 3-channel images "
                          "but --model_dir=") in line
  assert "trained on 1-channel images" in line


def test_resume_takes_the_data_from_the_record_and_names_the_schedule(
    run, caplog):
  # No data flag: the recorded 4-class records (LeNet/fc4/biases stays
  # [4]); a new learning rate may change.
  caplog.set_level(logging.INFO, logger="absl")
  assert run_in_process("train", [
      f"--model_dir={run['model_dir']}", "--batch_size=2", "--max_steps=4",
      "--learning_rate=0.1", "--verbosity=0"]) == 0
  checkpoint = tf.train.latest_checkpoint(run["model_dir"])
  assert checkpoint.endswith("model.ckpt-4")
  assert tf.train.load_variable(checkpoint, "LeNet/fc4/biases").shape == (4,)
  resumed = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith("Resuming")]
  # Warm-up of 50 steps: at step 2 the rate is (2 + 1) / 50 of the peak,
  # 0.05 * 0.06 = 0.003 recorded, 0.1 * 0.06 = 0.006 now.
  assert resumed == [
      f"Resuming from {run['model_dir']}/model.ckpt-2 (step 2 of "
      "--max_steps=4, recorded 2) with another learning-rate schedule than "
      "it recorded: learning_rate 0.05 -> 0.1; the learning rate at step 2 "
      "moves from 0.003 to 0.006. To keep the recorded schedule, pass "
      "--learning_rate=0.05."]
  assert [r.levelname for r in caplog.records
          if r.getMessage() in resumed] == ["INFO"]
  with open(os.path.join(run["model_dir"], "run_config.json")) as f:
    record = json.load(f)
  assert record["dataset_dir"] == run["four"]
  assert record["classifier"]["num_classes"] == 4
  assert record["classifier"]["learning_rate"] == 0.1


def test_the_same_dataset_dir_spelt_another_way_is_the_same_data(
    four_class_run):
  record = run_config.read(four_class_run["model_dir"])
  same = os.path.relpath(four_class_run["four"]) + os.sep + "." + os.sep
  setup = run_setup.ModelSetup("lenet", 4, 8, "tfrecord", same, record)
  assert run_config.changes(record, setup, resume.SAME_DATA) == []
  other = dataclasses.replace(setup, dataset_dir=four_class_run["two"])
  assert run_config.changes(record, other, resume.SAME_DATA) == [
      ("dataset_dir", four_class_run["four"], four_class_run["two"])]


@pytest.mark.slow
def test_a_resume_on_other_data_is_refused_in_a_real_process(run):
  before = snapshot(run["model_dir"])
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "train.py"),
       f"--model_dir={run['model_dir']}", f"--dataset_dir={run['two']}",
       "--batch_size=2", "--max_steps=4"],
      capture_output=True, text=True, timeout=300, cwd=ROOT)
  line = the_error_line(result.stderr, "train")
  assert result.returncode == 2, line
  assert f"--dataset_dir={run['two']} but --model_dir=" in line
  assert snapshot(run["model_dir"]) == before
