"""Shared TF set-up for the tests: graph mode, quiet logs, 4 virtual CPUs.

Every test builds its own `tf.Graph`; sessions get `NUM_CPUS` virtual CPU
devices so up to four towers run on a machine without GPUs.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import estimator_multigpu as emg  # pylint: disable=g-import-not-at-top

tf.get_logger().setLevel("ERROR")
# The one-device references run tf-slim model_fns unwrapped, before any
# `multi_gpu` call applied the fixes tf-slim 1.1.0 needs on TF >= 2.15: apply
# them once, so no test depends on which test ran first on its worker.
from estimator_multigpu import slim_compat  # pylint: disable=g-import-not-at-top

slim_compat.apply_all()

NUM_CPUS = 4


@pytest.fixture
def session_config():
  """A ConfigProto with NUM_CPUS virtual CPU devices."""
  return emg.make_session_config(num_cpus=NUM_CPUS)


@pytest.fixture
def run_config(session_config, tmp_path):
  """A RunConfig with NUM_CPUS virtual CPUs and a fresh model dir."""
  return tf.estimator.RunConfig(model_dir=str(tmp_path / "model"),
                                session_config=session_config,
                                tf_random_seed=1, save_summary_steps=1000,
                                log_step_count_steps=1000)
