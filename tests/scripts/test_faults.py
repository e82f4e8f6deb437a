"""Faults cost at most the work since the last checkpoint, with clear words.

Every test runs the real train.py in a subprocess and really sends the
signal or causes the fault (real files, really damaged). Cluster faults are
in tests/cluster/test_cluster_faults.py.
"""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from estimator_multigpu.runtime import checkpoints

pytestmark = pytest.mark.slow  # every test starts train.py.

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# --verbosity=1: TensorFlow's own INFO lines ("Restoring parameters from")
# say which checkpoint a run really restored.
TRAIN = [sys.executable, os.path.join(ROOT, "train.py"), "--model_name=mlp",
         "--log_every_n_steps=20", "--save_summary_steps=1000",
         "--verbosity=1"]


def run_train(model_dir, *args, timeout=240):
  return subprocess.run(TRAIN + [f"--model_dir={model_dir}", *args],
                        capture_output=True, text=True, timeout=timeout,
                        cwd=ROOT)


def start_train(model_dir, *args):
  return subprocess.Popen(TRAIN + [f"--model_dir={model_dir}", *args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, cwd=ROOT)


def latest_step(model_dir):
  path = tf.train.latest_checkpoint(str(model_dir))
  return int(path.rsplit("-", 1)[1]) if path else None


def wait_for_checkpoint_after(model_dir, step, process, timeout=120):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    latest = latest_step(model_dir)
    if latest is not None and latest > step:
      return latest
    assert process.poll() is None, process.communicate()[1][-2000:]
    time.sleep(0.2)
  process.kill()
  raise AssertionError(f"no checkpoint past step {step} in {timeout} s")


def assert_checkpoints_load(model_dir):
  state = tf.train.get_checkpoint_state(str(model_dir))
  for path in state.all_model_checkpoint_paths:
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
      assert np.all(np.isfinite(reader.get_tensor(name))), (path, name)
  # Every checkpoint file in the dir, listed or not, is complete and finite.
  for checkpoint in checkpoints.find_checkpoints(str(model_dir)):
    assert checkpoints.unusable_reason(checkpoint) is None, checkpoint.prefix


def test_sigkill_then_resume(tmp_path):
  process = start_train(tmp_path, "--max_steps=1000000",
                        "--save_checkpoints_steps=25")
  wait_for_checkpoint_after(tmp_path, 25, process)
  process.send_signal(signal.SIGKILL)
  process.wait(timeout=30)
  killed_at = latest_step(tmp_path)
  assert_checkpoints_load(tmp_path)
  result = run_train(tmp_path, f"--max_steps={killed_at + 30}",
                     "--save_checkpoints_steps=1000")
  assert result.returncode == 0, result.stderr[-2000:]
  assert latest_step(tmp_path) == killed_at + 30
  assert f"model.ckpt-{killed_at}" in result.stderr  # restored from there.
  assert_checkpoints_load(tmp_path)


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_write_a_final_checkpoint(tmp_path, signal_number):
  process = start_train(tmp_path, "--max_steps=1000000",
                        "--save_checkpoints_steps=100000")
  wait_for_checkpoint_after(tmp_path, -1, process)  # step 0 at start.
  time.sleep(1.0)
  process.send_signal(signal_number)
  _, stderr = process.communicate(timeout=60)
  assert process.returncode == 128 + signal_number, stderr[-2000:]
  stopped_at = int(stderr.split("Stopped by signal")[1].split("at step ")[1]
                   .split(";")[0])
  assert stopped_at > 0 and latest_step(tmp_path) == stopped_at
  assert_checkpoints_load(tmp_path)


def test_nan_loss_names_the_step_and_keeps_the_last_checkpoint(tmp_path):
  assert run_train(tmp_path, "--max_steps=20").returncode == 0
  result = run_train(tmp_path, "--max_steps=200", "--optimizer=sgd",
                     "--learning_rate=1e12", "--warmup_steps=0",
                     "--learning_rate_decay_type=fixed",
                     "--save_checkpoints_steps=100000")
  assert result.returncode != 0
  assert "NonFiniteLossError: The loss is" in result.stderr
  message = result.stderr.split("NonFiniteLossError: The loss is")[1]
  step = int(message.split(" at step ")[1].split(" ")[0])
  assert step > 20 and "non-finite in tower(s)" in message
  assert latest_step(tmp_path) == 20
  assert_checkpoints_load(tmp_path)


DIVERGE = ["--optimizer=sgd", "--learning_rate=1e12", "--warmup_steps=0",
           "--learning_rate_decay_type=fixed", "--save_checkpoints_steps=1"]


@pytest.mark.parametrize("args", [
    [], ["--virtual_cpus=4", "--moving_average_decay=0.9"],
    ["--clip_gradients_by_norm=1.0"]], ids=["2_towers", "4_towers_ema", "clip"])
def test_nan_never_reaches_a_checkpoint_saved_every_step(tmp_path, args):
  result = run_train(tmp_path, "--max_steps=200", *DIVERGE, *args)
  assert result.returncode != 0
  error = result.stderr.split("NonFiniteLossError: ")[-1]
  assert "NaN or Inf" in error or "The loss is" in error, result.stderr[-3000:]
  # The error names the newest checkpoint, which is the last finite one.
  named = error.split("The newest checkpoint, ")[1].split(",")[0]
  assert named == tf.train.latest_checkpoint(str(tmp_path))
  assert_checkpoints_load(tmp_path)
  if args:
    return
  # A rerun restores that checkpoint, not NaN. (Its weights may be huge
  # already, diverging again at once: the message then names the older
  # checkpoints to go back to.)
  result = run_train(tmp_path, "--max_steps=200", "--optimizer=sgd",
                     "--learning_rate=0.01", timeout=120)
  assert f"Restoring parameters from {named}" in result.stderr
  assert result.returncode == 0 or "NonFiniteLossError" in result.stderr
  assert_checkpoints_load(tmp_path)


def test_damaged_state_file_and_newest_checkpoint_resume_from_the_last_good(
    tmp_path):
  assert run_train(tmp_path, "--max_steps=10",
                   "--save_checkpoints_steps=5").returncode == 0
  (tmp_path / "checkpoint").write_text("garbled {{{")
  newest = [p for p in tmp_path.glob("model.ckpt-10.data-*")]
  largest = max(newest, key=lambda p: p.stat().st_size)
  os.truncate(largest, largest.stat().st_size // 2)
  (tmp_path / "model.ckpt-11_temp").mkdir()  # as left by a killed save.
  (tmp_path / "model.ckpt-11.data-00000-of-00002").write_bytes(b"x")
  result = run_train(tmp_path, "--max_steps=12", "--save_checkpoints_steps=5")
  assert result.returncode == 0, result.stderr[-3000:]
  assert (f"Checkpoint {tmp_path}/model.ckpt-10 cannot be restored: "
          "unreadable") in result.stderr
  assert f"Resuming from the newest usable one, {tmp_path}/model.ckpt-5" in (
      result.stderr)
  assert f"Restoring parameters from {tmp_path}/model.ckpt-5" in result.stderr
  assert latest_step(tmp_path) == 12
  assert not list(tmp_path.glob("model.ckpt-11*"))
  assert os.listdir(tmp_path / "corrupt")
  assert_checkpoints_load(tmp_path)


def test_deleted_state_file_resumes_instead_of_starting_over(tmp_path):
  assert run_train(tmp_path, "--max_steps=10",
                   "--save_checkpoints_steps=5").returncode == 0
  (tmp_path / "checkpoint").unlink()
  result = run_train(tmp_path, "--max_steps=12", "--save_checkpoints_steps=5")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "checkpoint is missing, but the model dir holds checkpoints: " \
         "rebuilt it from the newest usable one, model.ckpt-10" in result.stderr
  assert f"Restoring parameters from {tmp_path}/model.ckpt-10" in result.stderr
  assert latest_step(tmp_path) == 12


@pytest.mark.parametrize("args,message", [
    (["--model_dir=/proc/estimator_multigpu_test"], "cannot be written"),
    (["--min_free_disk_mb=1000000000"], "MB free, less than"),
])
def test_unusable_model_dir_fails_before_any_step(tmp_path, args, message):
  result = subprocess.run(
      TRAIN + [f"--model_dir={tmp_path}", *args], capture_output=True,
      text=True, timeout=120, cwd=ROOT)
  assert result.returncode != 0 and message in result.stderr
  assert "Saving checkpoints" not in result.stderr
  assert "loss = " not in result.stderr


# Bad flags: tests/scripts/test_mistakes.py (a table, in process).


def test_gpus_flag_pins_before_tensorflow_lists_devices(tmp_path):
  # absl runs TensorFlow's init callback (it lists the physical devices)
  # before main: --gpus must act while the flags are parsed.
  hidden = run_train(tmp_path, "--max_steps=2", "--gpus=", timeout=120)
  assert hidden.returncode == 0, hidden.stderr[-2000:]
  assert "came too late" not in hidden.stderr
  assert latest_step(tmp_path) == 2
  one = run_train(tmp_path / "one", "--max_steps=2", "--gpus=0", timeout=120)
  assert "came too late" not in one.stderr
  if not tf.config.list_physical_devices("GPU"):  # CI: a clear error.
    assert one.returncode != 0
    assert ("flag --gpus=['0']: pin_gpus([0]) set CUDA_VISIBLE_DEVICES='0', "
            "but TensorFlow sees 0 GPU(s)") in one.stderr
  else:
    assert one.returncode == 0, one.stderr[-2000:]
