"""Issue 35, eval.py as robust as train.py (estimator_multigpu.runtime.
evaluation, cli/model_dir/eval_dirs.py): a truncated newest checkpoint, one
rotated away under it, a deleted state file, a read-only model dir,
`--model_dir=<run>/eval`, a `--model_dir` that is a file.

Through the scripts' entry points in this process; eval.py next to a live
training as real processes (slow).
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

from absl import logging
import pytest
import tensorflow as tf
from test_mistakes import ROOT
from test_mistakes import run_in_process
from test_mistakes import the_error_line
from test_newcomer import metrics
from test_newcomer import run_script

import eval as eval_script

pytestmark = pytest.mark.usefixtures("parsed_flags")


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
  """mlp on the digits, checkpoints at steps 0, 2, 4 and 6 (the last)."""
  model_dir = str(tmp_path_factory.mktemp("eval_robust") / "run")
  assert run_in_process("train", [
      f"--model_dir={model_dir}", "--model_name=mlp", "--max_steps=6",
      "--save_checkpoints_steps=2", "--batch_size=8"]) == 0
  return model_dir


@pytest.fixture
def run(digits_run, tmp_path):
  """A copy of the trained run for one test."""
  model_dir = str(tmp_path / "run")
  shutil.copytree(digits_run, model_dir)
  return model_dir


def files(model_dir: str) -> dict:
  """name -> size of the model dir's files (what eval.py must not change)."""
  return {name: os.path.getsize(os.path.join(model_dir, name))
          for name in os.listdir(model_dir)
          if os.path.isfile(os.path.join(model_dir, name))}


def evaluate(argv, capsys) -> tuple:
  """(status, metrics of the last line or the error line) of eval.py."""
  capsys.readouterr()
  status = run_script("eval", argv)
  captured = capsys.readouterr()
  if status:
    return status, the_error_line(captured.err, "eval")
  return status, metrics(captured.out)


@pytest.mark.parametrize("once", [["--once"], []])
def test_a_truncated_newest_checkpoint_is_skipped_with_a_warning(
    run, once, capsys, caplog):
  caplog.set_level(logging.INFO, logger="absl")
  newest = f"{run}/model.ckpt-6"
  data = glob.glob(newest + ".data-*")
  for path in data:  # cut every shard: whichever holds the weights.
    os.truncate(path, os.path.getsize(path) // 2)
  before = files(run)
  # Continuous eval stops too: the checkpoint at the recorded last step
  # (6) cannot be read, so no newer one will come.
  status, result = evaluate([f"--model_dir={run}", *once], capsys)
  assert status == 0 and result["global_step"] == 4, result
  warnings = [r.getMessage() for r in caplog.records
              if r.levelname == "WARNING" and newest in r.getMessage()]
  assert len(warnings) == 1, caplog.text
  assert warnings[0].startswith(f"Skipping checkpoint {newest}: unreadable (")
  assert f"reading the newest one that reads back, {run}/model.ckpt-4" in (
      warnings[0])
  assert files(run) == before  # skipped, not moved: eval.py only reads.


def test_a_checkpoint_rotated_away_is_replaced_by_the_newest(
    run, tmp_path, monkeypatch, capsys, caplog):
  # The run as it was at step 4; the "training" saves step 6 and rotates
  # step 4 away just after eval.py chose step 4, before it reads it.
  later = str(tmp_path / "later")
  os.makedirs(later)
  for path in glob.glob(f"{run}/model.ckpt-6.*"):
    shutil.move(path, later)
  tf.compat.v1.train.update_checkpoint_state(run, "model.ckpt-4")
  check_fits = eval_script.check_fits

  def rotate_then_check(planned, checkpoint):
    if checkpoint.endswith("model.ckpt-4"):
      for path in glob.glob(f"{later}/*"):
        shutil.move(path, run)
      tf.compat.v1.train.update_checkpoint_state(run, "model.ckpt-6")
      for path in glob.glob(f"{checkpoint}.*"):
        os.remove(path)
    check_fits(planned, checkpoint)

  monkeypatch.setattr(eval_script, "check_fits", rotate_then_check)
  caplog.set_level(logging.WARNING, logger="absl")
  status, result = evaluate([f"--model_dir={run}", "--once"], capsys)
  assert status == 0 and result["global_step"] == 6, result
  assert (f"Checkpoint {run}/model.ckpt-4 was removed before it could be "
          f"read (a training keeps only its newest checkpoints); evaluating "
          f"the newest one, {run}/model.ckpt-6, instead.") in caplog.text


def test_without_the_state_file_the_checkpoints_on_disk_are_found(
    run, capsys):
  os.remove(f"{run}/checkpoint")
  status, result = evaluate([f"--model_dir={run}", "--once"], capsys)
  assert status == 0 and result["global_step"] == 6, result
  status, result = evaluate([f"--checkpoint_path={run}"], capsys)
  assert status == 0 and result["global_step"] == 6, result
  assert not os.path.exists(f"{run}/checkpoint")  # eval.py writes nothing.


@pytest.fixture
def read_only(run):
  """`run`, made read-only (root: immutable); skips where it cannot be."""
  os.chmod(run, 0o555)
  if os.access(run, os.W_OK):  # root ignores the mode bits.
    subprocess.run(["chattr", "+i", run], capture_output=True, check=False)
  if os.access(run, os.W_OK):
    os.chmod(run, 0o755)
    pytest.skip("cannot make a read-only folder here (root without chattr)")
  yield run
  subprocess.run(["chattr", "-i", run], capture_output=True, check=False)
  os.chmod(run, 0o755)


def test_a_read_only_model_dir_is_evaluated_events_in_a_named_folder(
    read_only, tmp_path, monkeypatch, capsys, caplog):
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  caplog.set_level(logging.INFO, logger="absl")
  status, result = evaluate([f"--model_dir={read_only}", "--once"], capsys)
  assert status == 0 and result["global_step"] == 6, result
  events, = glob.glob(f"{tmp_path}/eval_events_*")
  assert glob.glob(f"{events}/events.out.tfevents.*")
  said = [r.getMessage() for r in caplog.records if events in r.getMessage()]
  assert said == [
      f"{read_only}/eval cannot be written (a read-only model dir?): the "
      f"evaluation's events go to {events} instead; "
      "--eval_events_dir=<folder> chooses the folder."]
  assert not os.path.exists(f"{read_only}/eval")
  # --eval_events_dir names the folder.
  status, _ = evaluate([f"--model_dir={read_only}", "--once",
                        f"--eval_events_dir={tmp_path}/mine"], capsys)
  assert status == 0 and glob.glob(f"{tmp_path}/mine/events.out.tfevents.*")


def test_the_runs_eval_folder_points_at_the_run(run, capsys):
  for folder in (f"{run}/eval", f"{run}/eval/"):
    status, line = evaluate([f"--model_dir={folder}", "--once"], capsys)
    assert status == 2, line
    assert line == (
        f"eval.py: error: --model_dir={folder} holds no run, but it is a "
        f"folder of the run {run} (eval.py writes its events there), which "
        f"holds the checkpoints; give --model_dir={run}.")


@pytest.mark.parametrize("script", ["train", "eval"])
def test_a_model_dir_that_is_a_file_is_named_as_one(script, tmp_path,
                                                    capsys):
  path = tmp_path / "notes.txt"
  path.write_text("not a run")
  capsys.readouterr()
  status = run_in_process(script, [f"--model_dir={path}", "--max_steps=2"]
                          if script == "train" else
                          [f"--model_dir={path}", "--once"])
  line = the_error_line(capsys.readouterr().err, script)
  assert status == 2
  assert line == (
      f"{script}.py: error: --model_dir={path} is a file, not a folder; give "
      "the folder train.py writes its checkpoints to (a new path starts a new "
      "run).")


def wait_for_checkpoint(model_dir: str, process: subprocess.Popen,
                        timeout: float = 120) -> None:
  """Until the training's run_config.json and first checkpoint exist."""
  deadline = time.monotonic() + timeout
  while not tf.train.latest_checkpoint(model_dir):
    assert process.poll() is None and time.monotonic() < deadline
    time.sleep(0.2)


@pytest.mark.slow
def test_eval_next_to_a_live_training_evaluates_to_the_last_step(tmp_path):
  # A checkpoint every step, 5 kept: eval.py often chooses one that the
  # training deletes before it is read (here: every time until the end).
  model_dir = str(tmp_path / "live")
  python = [sys.executable, "-u"]
  train = subprocess.Popen(
      [*python, os.path.join(ROOT, "train.py"), f"--model_dir={model_dir}",
       "--model_name=mlp", "--max_steps=300", "--save_checkpoints_steps=1",
       "--batch_size=8"], cwd=ROOT, stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE, text=True)
  try:
    wait_for_checkpoint(model_dir, train)
    evaluated = subprocess.run(
        [*python, os.path.join(ROOT, "eval.py"), f"--model_dir={model_dir}",
         "--timeout_secs=120"],
        cwd=ROOT, capture_output=True, text=True, timeout=400)
  finally:
    _, train_err = train.communicate(timeout=400)
  assert train.returncode == 0, train_err[-2000:]
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert "is not a checkpoint" not in evaluated.stderr
  assert metrics(evaluated.stdout)["global_step"] == 300
