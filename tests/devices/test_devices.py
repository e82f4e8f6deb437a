"""Device spellings, the session's devices and the session-config helper."""

import pytest
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu import devices

tf1 = tf.compat.v1


@pytest.mark.parametrize("spelling,canonical", [
    ("/gpu:0", "/device:GPU:0"), ("/GPU:0", "/device:GPU:0"),
    ("/device:GPU:3", "/device:GPU:3"), ("gpu:1", "/device:GPU:1"),
    ("/cpu:1", "/device:CPU:1"), ("/device:cpu:2", "/device:CPU:2")])
def test_usual_spellings_are_accepted(spelling, canonical):
  assert devices.canonical_device(spelling) == canonical


def test_default_is_one_cpu_tower_without_gpus():
  assert devices.num_visible_gpus() == 0  # CI machines have no GPU.
  assert devices.resolve_devices(None) == ["/device:CPU:0"]


def test_int_means_the_first_gpus():
  assert devices.resolve_devices(2) == ["/device:GPU:0", "/device:GPU:1"]


def test_session_config_has_virtual_cpus_and_memory_growth():
  config = emg.make_session_config(num_cpus=3)
  assert config.device_count["CPU"] == 3
  assert config.gpu_options.allow_growth
  assert devices.session_devices(config) == [
      "/device:CPU:0", "/device:CPU:1", "/device:CPU:2"]
  with tf.Graph().as_default(), tf1.Session(config=config) as session:
    names = [d.name for d in session.list_devices()]
  assert sum(":CPU:" in name for name in names) == 3


def test_session_without_config_has_one_cpu():
  assert devices.session_devices(None) == ["/device:CPU:0"]


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_session_config_rejects_bad_cpu_counts(bad):
  with pytest.raises(ValueError, match="`num_cpus` must be an int >= 1"):
    emg.make_session_config(num_cpus=bad)
