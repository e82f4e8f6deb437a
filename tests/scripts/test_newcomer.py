"""Issue 26, "A newcomer's run": each row of its table, through the
scripts' entry points (the one-line mistakes are rows of test_mistakes.py).

In-process runs use `test_mistakes.run_in_process` (absl parses the argv,
SystemExit's code is the status); the `slow` ones start real processes.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

from absl import logging
import pytest
import tensorflow as tf
from test_mistakes import ROOT
from test_mistakes import run_in_process
from test_mistakes import the_error_line
from test_mistakes import trained  # noqa: F401 (a fixture)

from estimator_multigpu.runtime import evaluation
from estimator_multigpu.runtime import model_dir_lock

from cli.flags import use_table
from datasets import convert
import train

pytestmark = pytest.mark.usefixtures("parsed_flags")
SYNTHETIC = ["--dataset_name=synthetic", "--image_size=8", "--num_classes=10"]


def run_script(script: str, argv: list) -> int:
  """`run_in_process`, for a script that may also end without exiting
  (eval.py's main returns after printing the metrics)."""
  try:
    return run_in_process(script, argv)
  except pytest.fail.Exception:  # it returned: success.
    return 0


def metrics(stdout: str) -> dict:
  """eval.py's last line, `key=value ...`, as floats."""
  pairs = stdout.strip().splitlines()[-1].split()
  return {key: float(value) for key, value in
          (pair.split("=") for pair in pairs)}


# ----------------------------------------- row 1-2: batch 1 on N towers


@pytest.mark.parametrize("towers", [2, 4])
@pytest.mark.parametrize("net,data", [
    ("lenet", []), ("cifarnet", ["--dataset_name=synthetic",
                                 "--image_size=32"])])
def test_batch_of_one_on_towers_trains(net, data, towers, tmp_path, capsys):
  # 1 example on 2 or 4 towers: every tower but the first has an empty
  # shard, which crashed oneDNN's convolution (issue 26, row 1).
  assert run_in_process("train", [
      f"--model_name={net}", *data, "--batch_size=1", "--max_steps=2",
      f"--virtual_cpus={towers}", f"--model_dir={tmp_path}/m"]) == 0
  assert tf.train.latest_checkpoint(f"{tmp_path}/m").endswith("ckpt-2")
  assert "error" not in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("towers", [2, 4])
def test_batch_of_one_on_towers_trains_batch_norm_net(towers, tmp_path):
  assert run_in_process("train", [
      "--model_name=resnet_v1_50", "--dataset_name=synthetic",
      "--image_size=32", "--batch_size=1", "--max_steps=1",
      f"--virtual_cpus={towers}", f"--model_dir={tmp_path}/m"]) == 0
  step = tf.train.load_variable(f"{tmp_path}/m", "global_step")
  assert step == 1


def test_eval_last_batch_smaller_than_towers(tmp_path, capsys):
  # The digits' eval split has 360 images: batches of 17 leave 3 for the
  # last batch, fewer than the 4 towers (issue 26, row 2).
  model_dir = f"{tmp_path}/m"
  assert run_in_process("train", ["--batch_size=1", "--max_steps=2",
                                  f"--model_dir={model_dir}"]) == 0
  capsys.readouterr()
  assert run_script("eval", [f"--model_dir={model_dir}", "--once",
                             "--batch_size=17", "--virtual_cpus=4"]) == 0
  result = metrics(capsys.readouterr().out)
  assert result["global_step"] == 2 and 0 <= result["accuracy"] <= 1
  assert 0 < result["loss"] < 10  # ln(10) = 2.3 for an untrained net.


# ------------------------------------------ row 3: one writer per model dir


def live_lock(model_dir: str, pid: int) -> None:
  os.makedirs(model_dir, exist_ok=True)
  with open(os.path.join(model_dir, model_dir_lock.LOCK_NAME), "w") as f:
    json.dump({"host": socket.gethostname(), "pid": pid, "job": None,
               "started": "earlier"}, f)


def dead_pid() -> int:
  process = subprocess.Popen(["true"])
  process.wait()
  return process.pid


def test_a_dead_runs_lock_is_taken_over_with_a_warning(tmp_path, caplog):
  model_dir = f"{tmp_path}/m"
  live_lock(model_dir, dead_pid())
  caplog.set_level(logging.WARNING, logger="absl")
  assert run_in_process("train", [f"--model_dir={model_dir}",
                                  "--max_steps=1", "--batch_size=8"]) == 0
  assert "Taking over --model_dir=" in caplog.text
  assert not os.path.exists(os.path.join(model_dir, "train.lock"))


def test_lock_states(tmp_path):
  path = model_dir_lock.acquire(str(tmp_path))
  assert model_dir_lock.acquire(str(tmp_path)) == path  # ours: no conflict.
  live_lock(str(tmp_path), os.getppid())  # pytest's parent: alive.
  with pytest.raises(model_dir_lock.ModelDirLockedError,
                     match=f"PID {os.getppid()} on host"):
    model_dir_lock.acquire(str(tmp_path))
  owner = {"host": "elsewhere", "pid": 1, "job": None}
  assert model_dir_lock.is_live(owner, path, None)  # fresh heartbeat.
  os.utime(path, (0, 0))
  assert not model_dir_lock.is_live(owner, path, None)  # stale.
  assert not model_dir_lock.is_live({**owner, "job": "j"}, path, "j")
  assert not model_dir_lock.is_live({}, path, None)  # garbled.


def test_only_the_chief_holds_the_lock(tmp_path):
  class Task:  # the attributes writer_lock reads.
    is_chief, type, cluster = False, "worker", {"chief": ["a:1"],
                                                "ps": ["b:1"]}
  from cli.model_dir import checkpoints  # pylint: disable=g-import-not-at-top
  with checkpoints.writer_lock(Task(), str(tmp_path), 0):
    assert not os.path.exists(tmp_path / "train.lock")
  Task.is_chief = True
  with checkpoints.writer_lock(Task(), str(tmp_path), 0) as path:
    assert json.load(open(path))["job"] == checkpoints.job_id(Task())


def test_the_evaluator_checks_the_model_dir_a_worker_does_not(tmp_path):
  class Task:  # the attributes writer_lock reads.
    is_chief, type, cluster = False, "evaluator", {"chief": ["a:1"]}
  from cli.model_dir import checkpoints  # pylint: disable=g-import-not-at-top
  a_file = tmp_path / "a_file"
  a_file.write_text("")
  with pytest.raises(ValueError, match="is a file, not a folder"):
    with checkpoints.writer_lock(Task(), str(a_file), 0):
      pass
  with checkpoints.writer_lock(Task(), str(tmp_path / "m"), 0):
    assert os.path.isdir(tmp_path / "m")  # checked (created) ...
  assert not os.path.exists(tmp_path / "m" / "train.lock")  # ... not locked.
  Task.type = "worker"  # writes no checkpoint: nothing to check.
  with checkpoints.writer_lock(Task(), str(a_file), 0):
    pass


@pytest.mark.slow
def test_a_second_training_stops_at_once_naming_the_first(tmp_path):
  model_dir = str(tmp_path / "m")
  first = subprocess.Popen(
      [sys.executable, "train.py", f"--model_dir={model_dir}",
       "--model_name=mlp", "--max_steps=100000", "--batch_size=8"],
      cwd=ROOT, stderr=subprocess.PIPE, text=True)
  try:
    while not os.path.exists(os.path.join(model_dir, "train.lock")):
      assert first.poll() is None, first.stderr.read()
      time.sleep(0.5)
    second = subprocess.run(
        [sys.executable, "train.py", f"--model_dir={model_dir}",
         "--model_name=mlp", "--learning_rate=0.01"], cwd=ROOT,
        capture_output=True, text=True, timeout=300)
  finally:
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=300)
  line = the_error_line(second.stderr, "train")
  assert second.returncode == 2, line
  assert re.search(rf"is being written by another training, PID {first.pid} "
                   rf"on host {socket.gethostname()}", line)
  assert "Wait for it or stop it, or give another --model_dir" in line


# ------------------------------------- row 4 on: nothing ignored or silent


@pytest.mark.parametrize("use", use_table.USES, ids=lambda use: use.flag)
def test_every_row_of_the_flag_table_names_what_would_use_it(use):
  values = {"script": "export.py", "dataset_name": "digits", "once": True,
            "checkpoint_path": None, "job_name": None, "tf_config": None,
            "virtual_cpus": 2, use.flag: "x"}
  for script in use_table.ALL:
    if script not in use.scripts or not use.used({**values,
                                                  "script": script}):
      message = use_table.unused(use, {**values, "script": script})
      assert message.startswith(f"--{use.flag}=x is used only {use.needs}")
      assert message.endswith(f"drop --{use.flag}.")
      return
  pytest.fail(f"--{use.flag} is used everywhere: no row needed")


def test_paths_expand_home_and_variables(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))
  monkeypatch.setenv("RUNS", str(tmp_path / "runs"))
  monkeypatch.chdir(tmp_path)
  for model_dir in ("~/runs/x", "$RUNS/y"):
    assert run_in_process("train", [f"--model_dir={model_dir}",
                                    "--model_name=mlp", "--max_steps=1",
                                    "--batch_size=8"]) == 0
  assert os.listdir(tmp_path / "runs") == ["x", "y"] or sorted(
      os.listdir(tmp_path / "runs")) == ["x", "y"]
  assert not os.path.exists(tmp_path / "~")


def test_max_steps_at_or_below_the_step_trains_nothing(trained, tmp_path,
                                                       caplog):
  model_dir = str(tmp_path / "m")
  shutil.copytree(trained["trained"], model_dir)
  before = open(f"{model_dir}/run_config.json").read()
  caplog.set_level(logging.INFO, logger="absl")
  assert run_in_process("train", [f"--model_dir={model_dir}", *SYNTHETIC,
                                  "--max_steps=1", "--batch_size=8"]) == 0
  assert (f"--model_dir={model_dir} is already at step 2, at or past "
          "--max_steps=1: nothing to train.") in caplog.text
  assert "Training done" not in caplog.text
  assert "Building the training graph" not in caplog.text
  assert open(f"{model_dir}/run_config.json").read() == before


def test_continuous_eval_says_it_waits(tmp_path, monkeypatch, capsys,
                                       caplog):
  monkeypatch.setattr(evaluation, "REPORT_EVERY_SECS", 1.0)
  caplog.set_level(logging.WARNING, logger="absl")
  status = run_in_process("eval", [f"--model_dir={tmp_path}/misspelt",
                                   "--timeout_secs=3"])
  line = the_error_line(capsys.readouterr().err, "eval")
  assert status == 1 and "No new checkpoint appeared" in line
  assert f"--model_dir={tmp_path}/misspelt does not exist" in caplog.text
  assert caplog.text.count("Still waiting for a new checkpoint") >= 1


def test_the_build_line_names_what_is_built(tmp_path, caplog):
  caplog.set_level(logging.INFO, logger="absl")
  assert run_in_process("train", [f"--model_dir={tmp_path}/m", "--max_steps=1",
                                  "--batch_size=8", "--verbosity=0"]) == 0
  assert ("Building the training graph of lenet on 2 tower(s); the first "
          "progress line follows") in caplog.text


@pytest.mark.parametrize("script", ["train", "eval", "export"])
def test_a_garbled_tf_config_is_named_by_every_script(script, trained,
                                                      monkeypatch, tmp_path,
                                                      capsys):
  monkeypatch.setenv("TF_CONFIG", '{"cluster": ')
  argv = {"train": ["--max_steps=1"], "eval": ["--once"],
          "export": [f"--export_dir={tmp_path}/e"]}[script]
  status = run_in_process(script, [f"--model_dir={trained['trained']}",
                                   *argv])
  line = the_error_line(capsys.readouterr().err, script)
  assert status == 2
  assert line.startswith(f"{script}.py: error: TF_CONFIG is not JSON")


def test_ctrl_c_that_interrupts_is_one_line_and_130(monkeypatch, capsys):
  def interrupted(task, settings):
    raise KeyboardInterrupt
  monkeypatch.setattr(train, "run", interrupted)
  assert run_in_process("train", ["--max_steps=1"]) == 130
  line = capsys.readouterr().err.strip()
  assert line.startswith("train.py: interrupted (Ctrl-C): stopped at once")
  assert "\n" not in line


DISK_FULL = (
    "/m/model.ckpt-5_temp/part-00000-of-00001.data-00000-of-00001."
    "tempstate1; No space left on device\n\t [[{{node save/SaveV2}}]]\n"
    "Hint: If you want to see a list of allocated tensors when OOM happens, "
    "add report_tensor_allocations_upon_oom to RunOptions for current "
    "allocation info.")


@pytest.mark.parametrize("error", [
    tf.errors.ResourceExhaustedError(None, None, DISK_FULL),
    OSError(28, "No space left on device", "/m/run_config.json")])
def test_a_full_disk_is_one_line(error, monkeypatch, capsys):
  def full(task, settings):
    raise error
  monkeypatch.setattr(train, "run", full)
  assert run_in_process("train", ["--max_steps=1"]) == 1
  line = the_error_line(capsys.readouterr().err, "train")
  assert re.match(r"train.py: error: No space left on device while writing "
                  r"/m/\S+: the disk is full. Free some space", line)
  assert "Hint" not in line and "OOM" not in line


# ------------------------------------- the converter's held-out split


def test_converter_holds_out_a_percentage_of_each_class():
  items = [(f"{label}/{k}.png", label) for label in range(3)
           for k in range(10)]
  kept, held = convert.hold_out(items, 10)
  assert [label for _, label in held] == [0, 1, 2]  # 1 of 10 per class.
  assert len(kept) == 27 and not set(kept) & set(held)
  assert convert.hold_out(items, 0) == (items, [])
  with pytest.raises(ValueError, match=r"expected a percentage in \[0, 100"):
    convert.hold_out(items, 100)


@pytest.mark.slow
def test_second_ctrl_c_in_a_real_run_exits_130_with_one_line(tmp_path):
  process = subprocess.Popen(
      [sys.executable, "train.py", f"--model_dir={tmp_path}/m",
       "--model_name=mlp", "--max_steps=1000000", "--batch_size=8",
       "--log_every_n_steps=1"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
  for line in process.stderr:  # wait for the first progress line.
    if "examples/sec" in line:
      break
  process.send_signal(signal.SIGINT)
  process.send_signal(signal.SIGINT)
  stderr = process.communicate(timeout=300)[1]
  assert process.returncode == 130
  assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
