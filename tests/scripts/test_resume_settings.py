"""Issue 44 row 3: a resume keeps the run's recorded settings (batch size,
schedule, options, seed, last step; devices excepted) unless given, and
names every setting it changes in one line (cli/model_dir/
resume_settings.py). Through train.py's entry point, in this process."""

import dataclasses
import json
import os
import shutil

from absl import logging
import pytest
from test_mistakes import run_in_process

from cli import settings as settings_lib
from cli.model_dir import resume_settings
from cli.model_dir import run_config

pytestmark = pytest.mark.usefixtures("parsed_flags")
FIRST = ["--dataset_name=synthetic", "--image_size=8", "--num_classes=4",
         "--model_name=lenet", "--batch_size=6", "--learning_rate=0.1",
         "--warmup_steps=0", "--moving_average_decay=0.9",
         "--random_seed=7", "--max_steps=2", "--virtual_cpus=3"]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
  model_dir = str(tmp_path_factory.mktemp("kept") / "run")
  assert run_in_process("train", [f"--model_dir={model_dir}", *FIRST]) == 0
  return model_dir


@pytest.fixture
def run(first_run, tmp_path):
  model_dir = str(tmp_path / "run")
  shutil.copytree(first_run, model_dir)
  return model_dir


def recorded(model_dir: str) -> dict:
  with open(os.path.join(model_dir, "run_config.json")) as f:
    return json.load(f)


def resume_lines(caplog) -> list:
  return [r.getMessage() for r in caplog.records
          if r.getMessage().startswith("Resuming")]


def test_a_resume_with_only_the_model_dir_keeps_every_setting(run, caplog):
  caplog.set_level(logging.INFO, logger="absl")
  before = recorded(run)
  # Only the model dir and a new last step: the batch, the schedule, the
  # averages and the seed are the record's, not the flags' defaults (64,
  # 0.05, 50 warm-up steps, no averages, seed 1); --virtual_cpus not kept.
  assert run_in_process("train", [f"--model_dir={run}", "--max_steps=3", "--verbosity=0"]) == 0
  after = recorded(run)
  assert after["global_batch_size"] == 6
  assert after["classifier"] == {**before["classifier"], "decay_steps": 3}
  assert after["options"] == before["options"]
  assert after["options"]["moving_average_decay"] == 0.9
  assert after["options"]["random_seed"] == 7
  assert len(after["towers"]) == 2  # the default (2 CPUs), not recorded 3.
  [line] = resume_lines(caplog)
  assert line.startswith(f"Resuming from {run}/model.ckpt-2 (step 2 of "
                         "--max_steps=3, recorded 2)")
  assert "Changed since the record" not in line


def test_a_resume_names_every_setting_it_changes_in_one_line(run, caplog):
  caplog.set_level(logging.INFO, logger="absl")
  assert run_in_process("train", [
      f"--model_dir={run}", "--max_steps=3", "--batch_size=4",
      "--random_seed=8", "--learning_rate=0.2", "--verbosity=0"]) == 0
  [line] = resume_lines(caplog)
  assert "learning_rate 0.1 -> 0.2" in line
  assert line.endswith(
      "Changed since the record: --batch_size 6 -> 4, --random_seed 7 -> 8 "
      "(to keep them, pass --batch_size=6 --random_seed=7).")
  assert "\n" not in line
  assert recorded(run)["global_batch_size"] == 4


def test_a_finished_run_resumed_bare_has_nothing_to_train(run, caplog):
  caplog.set_level(logging.INFO, logger="absl")
  assert run_in_process("train", [f"--model_dir={run}", "--verbosity=0"]) == 0
  assert any("is already at step 2, at or past --max_steps=2: nothing to "
             "train" in r.getMessage() for r in caplog.records)


def test_keep_recorded_fills_only_what_is_not_given(first_run, tmp_path):
  record = run_config.read(first_run)
  defaults = settings_lib.TrainSettings(
      run=settings_lib.RunSettings(model_dir=first_run))
  kept = resume_settings.keep_recorded(defaults, record, {"batch_size"})
  assert kept.data.batch_size == 64  # given: the flag's value.
  assert kept.optimization.learning_rate == 0.1
  assert kept.optimization.decay_steps == 2  # max(2 - 0, 1), recorded.
  assert kept.optimization.max_steps == 2
  assert kept.multi_gpu.moving_average_decay == 0.9
  assert kept.towers == defaults.towers
  longer = resume_settings.keep_recorded(defaults, record, {"max_steps"})
  assert longer.optimization.decay_steps is None  # derived anew.
  in_epochs = dataclasses.replace(record, options={
      **record.options, "num_epochs_per_decay": 2.0})
  epochs = lambda given: resume_settings.keep_recorded(
      defaults, in_epochs, given).optimization.num_epochs_per_decay
  assert epochs({"max_steps"}) == 2.0  # a longer run decays in epochs too.
  assert epochs(set()) is None  # the recorded decay_steps instead.
  fresh = dataclasses.replace(defaults, run=settings_lib.RunSettings(
      model_dir=str(tmp_path / "new")))
  assert resume_settings.keep_recorded(fresh, None, set()) == fresh
