"""Issue 44 row 6: tower mistakes in the script's words. --devices naming
virtual CPUs gets them (it was the library's session advice); GPUs the
machine lacks name --num_gpus and --virtual_cpus."""

import json

import pytest
import tensorflow as tf
from test_mistakes import run_in_process
from test_mistakes import the_error_line

from cli import towers

pytestmark = pytest.mark.usefixtures("parsed_flags")


def gpus() -> int:
  return len(tf.config.list_physical_devices("GPU"))


@pytest.mark.parametrize("devices,cpus", [
    (["/cpu:0", "/cpu:1", "/cpu:2"], 3), (["/CPU:1", "/device:CPU:0"], 2),
    (["/cpu:2"], 3), (["/cpu:0"], 1)])
def test_devices_naming_cpus_get_them(devices, cpus):
  resolved = towers.resolve_towers(None, devices, None)
  assert len(resolved.devices) == len(devices)
  assert resolved.session_config.device_count["CPU"] == cpus


def test_devices_naming_missing_gpus_name_the_script_flags():
  if gpus():
    pytest.skip("this machine has GPUs")
  with pytest.raises(ValueError) as error:
    towers.resolve_towers(None, ["/gpu:0", "/gpu:1"], None)
  assert str(error.value) == (
      "--devices=/gpu:0,/gpu:1 asks for /gpu:0, /gpu:1, but this machine "
      "shows 0 GPU(s) (CUDA_VISIBLE_DEVICES and --gpus limit them); give "
      "--num_gpus=N for the first N GPUs, or --virtual_cpus=N (or "
      "--devices=/cpu:0,...,/cpu:N-1) for N towers on virtual CPU devices.")


def test_train_on_three_cpu_devices_runs(tmp_path, capsys):
  assert run_in_process("train", [
      "--devices=/cpu:0,/cpu:1,/cpu:2", "--max_steps=1", "--batch_size=7",
      "--model_name=mlp", f"--model_dir={tmp_path}/m"]) == 0
  with open(tmp_path / "m" / "run_config.json") as f:
    assert len(json.load(f)["towers"]) == 3
  capsys.readouterr()
  if not gpus():
    assert run_in_process("train", [
        "--devices=/gpu:0", "--max_steps=1", "--model_name=mlp",
        f"--model_dir={tmp_path}/g"]) == 2
    line = the_error_line(capsys.readouterr().err, "train")
    assert "--num_gpus=N" in line and "--virtual_cpus=N" in line
