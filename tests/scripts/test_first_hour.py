"""Issue 54, a user's first hour with the scripts, as real processes.

One folder of photos (two classes) is converted and trained on with
relative paths and TensorFlow's default log level (no TF_CPP_MIN_LOG_LEVEL
in the environment); then, from another directory, eval.py, export.py, a
train.py with nothing left to train, and eval.py once the records moved. Each process's
stderr is checked to be quiet: no C++ start-up INFO lines, every line once.
A photo folder of one class is refused by convert.py. eval.py's Ctrl-C says
what eval.py was doing (a real SIGINT while it waits for a first
checkpoint; one raised mid-evaluation in this process).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from test_mistakes import ROOT
from test_mistakes import run_in_process
from test_mistakes import the_error_line

import eval as eval_script

pytestmark = pytest.mark.usefixtures("parsed_flags")
# An absl-format line: its prefix (level, time, thread, file:line), its text.
ABSL_LINE = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ (\S+):\d+\] (.*)$")
# TensorFlow's C++ INFO lines: TF 2.15's format, then absl's (a .cc file).
CPP_INFO = re.compile(r"^(\d{4}-\d\d-\d\d [\d:.]+: I |I\d{4} [\d:.]+ +\d+ "
                      r"\S+\.cc:\d+\] |WARNING: All log messages before)")


def photos(root, classes) -> str:
  """`root/<class>/<i>.png`, six 8x8 PNGs per class."""
  for k, name in enumerate(classes):
    os.makedirs(root / name)
    for i in range(6):
      pixels = np.full((8, 8, 3), 40 * k + 7 * i, np.uint8)
      (root / name / f"{i}.png").write_bytes(
          tf.io.encode_png(pixels).numpy())
  return str(root)


def script(name: str, *args, cwd, status: int = 0):
  """`python <name>.py args` in `cwd`, at TensorFlow's default log level;
  checks its status and that its stderr is quiet. Returns its stderr."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, f"{name}.py"), *args], cwd=cwd,
      env={**env, "PYTHONPATH": ROOT}, capture_output=True, text=True,
      timeout=300, check=False)
  assert result.returncode == status, result.stderr[-3000:]
  assert_quiet(result.stderr)
  return result.stderr


def assert_quiet(stderr: str) -> None:
  lines = [line for line in stderr.splitlines() if line.strip()]
  assert not [line for line in lines if CPP_INFO.match(line)], stderr
  texts = [ABSL_LINE.match(line).group(2) if ABSL_LINE.match(line) else line
           for line in lines]
  assert len(set(texts)) == len(texts), stderr


def warnings_of(stderr: str) -> list:
  return [line for line in stderr.splitlines() if line.startswith("W")]


@pytest.fixture(scope="module")
def first_hour(tmp_path_factory):
  """photos/ converted to records/ and trained on in run/, all relative."""
  work = tmp_path_factory.mktemp("first_hour")
  photos(work / "photos", ["cats", "dogs"])
  script("convert", "--image_dir=photos", "--output_dir=records",
         "--validation_percentage=34", cwd=work)
  script("train", "--dataset_name=tfrecord", "--dataset_dir=records",
         "--image_size=8", "--model_name=lenet", "--model_dir=run",
         "--max_steps=2", "--batch_size=4", cwd=work)
  return work


def test_the_run_record_holds_absolute_paths(first_hour):
  with open(first_hour / "run" / "run_config.json") as f:
    assert json.load(f)["dataset_dir"] == str(first_hour / "records")


def test_from_another_directory(first_hour, tmp_path):
  run = str(first_hour / "run")
  evaluated = script("eval", f"--model_dir={run}", "--once", cwd=tmp_path)
  [plan] = [line for line in evaluated.splitlines() if "multi_gpu eval:" in line]
  assert "gradients" not in plan and "variables on /cpu:0" in plan
  assert not warnings_of(evaluated), evaluated
  exported = script("export", f"--model_dir={run}", "--export_dir=exports",
                    cwd=tmp_path)
  assert not warnings_of(exported), exported

  # Nothing to train: that warning alone (not the schedule's warm-up one).
  resumed = script("train", f"--model_dir={run}", "--max_steps=1",
                   cwd=tmp_path)
  [warning] = warnings_of(resumed)
  assert "is already at step 2, at or past --max_steps=1: nothing to " \
      "train" in warning

  # The records moved: named as recorded.
  records = str(first_hour / "records")
  shutil.move(records, records + "_moved")
  try:
    failed = script("eval", f"--model_dir={run}", "--once", cwd=tmp_path,
                    status=2)
  finally:
    shutil.move(records + "_moved", records)
  line = the_error_line(failed, "eval")
  assert line == (
      f"eval.py: error: --dataset_dir={records}, as recorded in {run}/"
      "run_config.json by train.py, is not a directory: the data moved or "
      "was deleted. Move it back, or give --dataset_dir=<where it is now> "
      "(eval.py, export.py; a resume of train.py reads the recorded one).")


def test_a_folder_of_one_class_is_refused(tmp_path):
  photos(tmp_path / "one", ["cats"])
  failed = script("convert", "--image_dir=one", "--output_dir=records",
                  cwd=tmp_path, status=2)
  assert the_error_line(failed, "convert").startswith(
      "convert.py: error: image_dir one has one class subfolder, cats (6 "
      "images): a classifier needs two or more")
  assert not os.path.exists(tmp_path / "records" / "labels.txt")


def test_ctrl_c_while_eval_waits_for_a_first_checkpoint(tmp_path):
  os.makedirs(tmp_path / "empty")
  process = subprocess.Popen(
      [sys.executable, os.path.join(ROOT, "eval.py"),
       f"--model_dir={tmp_path}/empty"], cwd=tmp_path,
      stderr=subprocess.PIPE, text=True)
  lines = []
  for line in process.stderr:  # until it says that it waits.
    lines.append(line)
    if "waiting up to" in line:
      break
  process.send_signal(signal.SIGINT)
  lines += process.communicate(timeout=120)[1].splitlines(keepends=True)
  assert process.returncode == 130, "".join(lines)
  assert lines[-1].strip() == (
      f"eval.py: interrupted (Ctrl-C) while waiting for a checkpoint in "
      f"{tmp_path}/empty (none evaluated). eval.py only reads the model dir: "
      "nothing in it changed. Run eval.py again to evaluate.")
  assert "Traceback" not in "".join(lines)


def test_ctrl_c_mid_evaluation_names_the_checkpoint(first_hour, monkeypatch,
                                                    capsys):
  def interrupted(settings, planned, checkpoint):
    raise KeyboardInterrupt

  monkeypatch.setattr(eval_script, "evaluate_checkpoint", interrupted)
  capsys.readouterr()
  run = first_hour / "run"
  assert run_in_process("eval", [f"--model_dir={run}", "--once"]) == 130
  assert capsys.readouterr().err.splitlines()[-1] == (
      f"eval.py: interrupted (Ctrl-C) while evaluating {run}/model.ckpt-2: "
      "its metrics were not written. eval.py only reads the model dir: "
      "nothing in it changed. Run eval.py again to evaluate.")
