"""Single-machine recipes: listing devices, the report, pinning GPUs, configs.

The CLI and the pinning run in fresh subprocesses (started together, since
each pays TensorFlow's import) so this process's TF state does not matter.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu import devices
from estimator_multigpu.devices import __main__ as devices_cli
from estimator_multigpu.devices import gpu_visibility
from estimator_multigpu.devices import topology
from estimator_multigpu.devices.topology import DeviceRecord

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Before TensorFlow lists its devices: pin, re-pin, then see no GPU at all.
PIN_BEFORE_INIT = """
import os
import estimator_multigpu  # importing must not fix the GPUs.
from estimator_multigpu import devices
from estimator_multigpu.devices import gpu_visibility
import tensorflow as tf
result = {"reason_at_start": gpu_visibility.gpus_fixed_reason()}
result["scheduler"] = devices.pin_gpus([1, 3], verify=False)
result["order"] = os.environ.get("CUDA_DEVICE_ORDER")
result["none"] = devices.pin_gpus([])  # verify: lists the physical GPUs.
result["again"] = devices.pin_gpus("")  # same ids: nothing to change.
result["env"] = os.environ["CUDA_VISIBLE_DEVICES"]
result["gpus"] = len(tf.config.list_physical_devices("GPU"))
result["reason_after"] = gpu_visibility.gpus_fixed_reason()
print(json.dumps(result))
"""

# Pin GPU 0 (verified), start the eager runtime, then pin again: too late.
PIN_TOO_LATE = """
import os
from estimator_multigpu import devices
from estimator_multigpu.devices import gpu_visibility
import tensorflow as tf
result = {"cuda": tf.test.is_built_with_cuda()}
try:
  result["pinned"] = devices.pin_gpus([0])
except ValueError as error:
  result["verify_error"] = str(error)
result["order"] = os.environ.get("CUDA_DEVICE_ORDER")
tf.constant(1.0) + 1.0  # an eager op initialises the runtime.
result["reason"] = gpu_visibility.gpus_fixed_reason()
try:
  devices.pin_gpus([1])
except RuntimeError as error:
  result["late_error"] = str(error)
result["env"] = os.environ.get("CUDA_VISIBLE_DEVICES")
print(json.dumps(result))
"""


def _start(args, extra_env):
  env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
  env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONWARNINGS="ignore", **extra_env)
  return subprocess.Popen([sys.executable] + args, cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


@pytest.fixture(scope="module")
def runs():
  """The subprocesses' (returncode, stdout, stderr), run concurrently."""
  started = {
      "cli": _start(["-m", "estimator_multigpu.devices", "--num_cpus", "2"],
                    {}),
      "pin": _start(["-c", "import json\n" + PIN_BEFORE_INIT],
                    {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}),
      "late": _start(["-c", "import json\n" + PIN_TOO_LATE], {}),
  }
  results = {}
  for name, process in started.items():
    stdout, stderr = process.communicate(timeout=120)
    results[name] = (process.returncode, stdout, stderr)
  return results


def _json(run):
  returncode, stdout, stderr = run
  assert returncode == 0, stderr
  return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_cli_lists_the_virtual_cpus_and_says_there_is_no_gpu(runs):
  returncode, stdout, stderr = runs["cli"]
  assert returncode == 0, stderr
  assert stdout.startswith("Local devices:\n  /cpu:0 ")
  assert "/cpu:1" in stdout and "/gpu:" not in stdout
  assert "No GPU: TensorFlow sees none (CUDA_VISIBLE_DEVICES=<unset>" in (
      " ".join(stdout.split()))
  assert "Default towers (multi_gpu with devices=None): /cpu:0" in stdout
  assert "Aggregation device: /cpu:0\n  why: one tower" in stdout


@pytest.mark.slow
def test_pinning_before_tensorflow_lists_gpus_works(runs):
  result = _json(runs["pin"])
  assert result["reason_at_start"] is None
  assert result["scheduler"] == "5,7"  # ids count the scheduler's GPUs.
  assert result["order"] is None  # kept as the scheduler meant it.
  assert result["none"] == result["again"] == result["env"] == "-1"
  assert result["gpus"] == 0  # consistent: TensorFlow sees no GPU.
  assert "listed the physical devices" in result["reason_after"]


@pytest.mark.slow
def test_pinning_after_tensorflow_initialised_is_a_clear_error(runs):
  result = _json(runs["late"])
  assert result["order"] == "PCI_BUS_ID"  # nvidia-smi's numbering.
  if result["cuda"]:
    assert result.get("pinned") == "0" or "fewer GPUs" in result[
        "verify_error"]
  else:
    assert "sees 0 GPU(s) where 1 were asked for" in result["verify_error"]
    assert "built without CUDA" in result["verify_error"]
  assert result["reason"] == "TensorFlow's runtime is already initialised"
  assert result["late_error"].startswith("pin_gpus([1]) came too late: "
                                         "TensorFlow's runtime")
  assert "start the process with CUDA_VISIBLE_DEVICES=1" in result[
      "late_error"]
  assert result["env"] == "0"  # unchanged by the refused call.


@pytest.mark.parametrize("given,ids", [
    ([1, 3], [1, 3]), ("1,3", [1, 3]), (["1", "3"], [1, 3]), ((0,), [0]),
    ([], []), ("", [])])
def test_gpu_ids_spellings(given, ids):
  assert gpu_visibility.parse_gpu_ids(given) == ids


@pytest.mark.parametrize("given,error,match", [
    (3, TypeError, "must be a list of ints"),
    ([True], ValueError, "entry True is not a GPU id"),
    ([-1], ValueError, "entry -1 is not a GPU id"),
    ("1,x", ValueError, "entry 'x'"),
    ([1, 1], ValueError, "more than once"),
])
def test_bad_gpu_ids_are_clear_errors(given, error, match):
  with pytest.raises(error, match=match):
    devices.pin_gpus(given)  # checked before anything else happens.


@pytest.mark.parametrize("ids,started_with,value", [
    ([1, 3], None, "1,3"), ([1, 3], "4,5,6,7", "5,7"), ([], None, "-1"),
    ([0], "GPU-aaaa, GPU-bbbb", "GPU-aaaa"), ([], "2,3", "-1")])
def test_visible_devices_value(ids, started_with, value):
  assert gpu_visibility.visible_devices_value(ids, started_with) == value


def test_gpu_ids_outside_the_started_set_are_a_clear_error():
  with pytest.raises(ValueError, match=r"asks for GPU 2, but this process "
                     r"was started with CUDA_VISIBLE_DEVICES='4,5'"):
    gpu_visibility.visible_devices_value([0, 2], "4,5")


def test_session_config_memory_fraction():
  config = emg.make_session_config(2, True, True, gpu_memory_fraction=0.25)
  assert config.gpu_options.per_process_gpu_memory_fraction == 0.25
  assert config.gpu_options.allow_growth and config.device_count["CPU"] == 2
  default = emg.make_session_config(num_cpus=1, gpu_memory_growth=False)
  assert default.gpu_options.per_process_gpu_memory_fraction == 0.0
  assert not default.gpu_options.allow_growth


@pytest.mark.parametrize("fraction,error", [
    (0.0, ValueError), (1.5, ValueError), ("0.5", TypeError),
    (True, TypeError)])
def test_bad_memory_fractions_are_clear_errors(fraction, error):
  with pytest.raises(error, match="`gpu_memory_fraction`"):
    emg.make_session_config(gpu_memory_fraction=fraction)


def test_listing_on_a_cpu_machine():
  physical = devices.physical_devices()
  assert [r.name for r in physical] == ["/device:CPU:0"]
  local = devices.local_devices(emg.make_session_config(num_cpus=3))
  assert [(r.short_name, r.device_type, r.memory_bytes) for r in local] == [
      ("/cpu:0", "CPU", None), ("/cpu:1", "CPU", None),
      ("/cpu:2", "CPU", None)]


def gpu_records(links, memory=16 << 30):
  """A CPU plus one GPU per row of `links` (peer GPU ids, None: unknown)."""
  return [DeviceRecord("/device:CPU:0", "CPU")] + [
      DeviceRecord(f"/device:GPU:{k}", "GPU", memory,
                   f"device: {k}, name: Fake GPU, compute capability: 8.0",
                   None if peers is None else tuple(peers))
      for k, peers in enumerate(links)]


# Two NVLink pairs (0-1, 2-3) and no peer access across them.
PAIRS = [[1], [0], [3], [2]]


def test_peer_matrix_and_missing_pairs_from_links():
  assert topology.peer_matrix(gpu_records(PAIRS)) == [
      [True, True, False, False], [True, True, False, False],
      [False, False, True, True], [False, False, True, True]]
  assert topology.missing_peer_pairs(gpu_records(PAIRS)) == [
      (0, 2), (0, 3), (1, 2), (1, 3)]
  one_way = gpu_records([[1], []])  # 0 -> 1 only: not full peer access.
  assert topology.missing_peer_pairs(one_way) == [(0, 1)]


def test_report_for_gpus_without_full_peer_access():
  report = topology.device_report(gpu_records(PAIRS), "GPU0 X NV2",
                                  "0,1,2,3")
  assert "  /gpu:3   GPU    16.0 GiB  device: 3, name: Fake GPU" in report
  assert "  /cpu:0   CPU    host RAM" in report
  assert ("          gpu:0  gpu:1  gpu:2  gpu:3\n"
          "  gpu:0        -    yes     no     no\n"
          "  gpu:1      yes      -     no     no\n") in report
  assert "Default towers (multi_gpu with devices=None): /gpu:0, /gpu:1, " \
         "/gpu:2, /gpu:3" in report
  assert "Aggregation device: /cpu:0\n  why: 4 towers" in report
  reason = topology.default_aggregation_device(gpu_records(PAIRS)).reason
  assert " ".join(reason.split()) in " ".join(report.split())
  assert ("without peer access: gpu:0-gpu:2, gpu:0-gpu:3, gpu:1-gpu:2, "
          "gpu:1-gpu:3; a GPU aggregation device") in reason
  assert max(len(line) for line in report.splitlines()) <= 79
  assert report.endswith("nvidia-smi topo -m:\nGPU0 X NV2\n")
  assert "No GPU" not in report


def test_report_for_gpus_with_full_peer_access_suggests_gpu0():
  report = topology.device_report(gpu_records([[1], [0]]))
  assert "Aggregation device: /cpu:0" in report
  assert "Every GPU pair has peer access, so aggregation_device='/gpu:0'" in (
      topology.default_aggregation_device(gpu_records([[1], [0]])).reason)
  assert "nvidia-smi" not in report


def test_report_for_unknown_peer_access_and_one_gpu():
  unknown = topology.device_report(gpu_records([None, None], memory=None))
  assert "gpu:0        -      ?" in unknown and "memory ?" in unknown
  assert "Peer access is unknown" in " ".join(unknown.split())
  one = topology.default_aggregation_device(gpu_records([[]]))
  assert one.device == "/device:GPU:0" and one.reason.startswith("one tower")


def predict_model_fn(features, mode):
  w = tf.compat.v1.get_variable("w", [3])
  return tf.estimator.EstimatorSpec(
      mode, predictions=tf.multiply(features, w, name="prediction"))


@pytest.mark.parametrize("num_gpus", [0, 1, 2, 4])
def test_report_rule_matches_the_decorator_default(num_gpus, monkeypatch):
  """The decorator's variables sit on the aggregation device the report names
  (the graph is only built, so fake GPUs are enough)."""
  monkeypatch.setattr(devices, "num_visible_gpus", lambda: num_gpus)
  with tf.Graph().as_default() as graph:
    emg.multi_gpu(predict_model_fn)(tf.zeros([4, 3]), None,
                                    tf.estimator.ModeKeys.PREDICT, {},
                                    tf.estimator.RunConfig())
  handles = [op for op in graph.get_operations() if op.type == "VarHandleOp"]
  records = gpu_records([[]] * num_gpus)
  assert {op.device for op in handles} == {
      topology.default_aggregation_device(records).device}
  towers = {op.device for op in graph.get_operations()
            if op.name.endswith("prediction")}
  assert towers == set(topology.default_towers(records))


def test_nvidia_smi_is_optional(monkeypatch):
  monkeypatch.setattr(topology.shutil, "which", lambda name: None)
  assert topology.nvidia_smi_topology() is None


def test_cli_main_in_process(capsys):
  assert devices_cli.main(["--num_cpus", "2"]) == 0
  assert "/cpu:1" in capsys.readouterr().out



def test_cli_takes_virtual_cpus_like_the_scripts(capsys):
  assert devices_cli.main(["--virtual_cpus", "2"]) == 0
  assert "/cpu:1" in capsys.readouterr().out
  with pytest.raises(SystemExit):
    devices_cli.main(["--help"])
  help_text = capsys.readouterr().out
  assert "--virtual_cpus" in help_text and "--num_cpus" not in help_text
