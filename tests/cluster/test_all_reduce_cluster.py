"""Multi-worker all-reduce on loopback: real processes, TF_CONFIG, no ps.

Every task of a chief + workers cluster trains `all_reduce_task.model_fn`
on its own rows of a 7-example global batch through `emg.train_and_evaluate`;
the chief's checkpoint must equal one device trained on all 7 rows from the
same initial values (the chief's model.ckpt-0).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import all_reduce_task
import numpy as np
import pytest
import tensorflow as tf

from estimator_multigpu.cluster import launch

tf1 = tf.compat.v1
TASK = os.path.join(os.path.dirname(__file__), "all_reduce_task.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
pytestmark = pytest.mark.slow


def start_job(tmp_path, rows_per_task, towers, steps, **extra):
  """Starts one process per task; returns [(name, Popen, log path)]."""
  ports = launch.free_ports(len(rows_per_task))
  cluster = {"chief": [f"localhost:{ports[0]}"],
             "worker": [f"localhost:{p}" for p in ports[1:]]}
  names = [("chief", 0)] + [("worker", i) for i in range(len(ports) - 1)]
  tasks = []
  for (job, index), rows in zip(names, rows_per_task):
    env = dict(os.environ, TF_CONFIG=json.dumps(  # this checkout's package.
        {"cluster": cluster, "task": {"type": job, "index": index}}),
               PYTHONPATH=ROOT)
    log = tmp_path / f"{job}{index}.log"
    args = [sys.executable, TASK, f"--towers={towers}", f"--rows={rows}",
            f"--model_dir={tmp_path / f'{job}{index}'}", f"--steps={steps}"]
    args += [f"--{key}={value}" for key, value in extra.items()]
    with open(log, "w") as out:
      tasks.append((f"{job}:{index}", subprocess.Popen(
          args, env=env, stdout=out, stderr=subprocess.STDOUT), log))
  return tasks


def wait_all(tasks, timeout=240):
  deadline = time.time() + timeout
  for name, process, log in tasks:
    try:
      process.wait(timeout=max(1, deadline - time.time()))
    except subprocess.TimeoutExpired:
      for _, other, _ in tasks:
        other.kill()
      pytest.fail(f"{name} did not end: {log.read_text()[-2000:]}")
  return {name: process.returncode for name, process, _ in tasks}


def one_device(steps, initial_checkpoint, trajectory=None, batch_norm=False,
               losses=None):
  """The unwrapped model_fn on all 7 rows, from the chief's start (its
  variables after each step are appended to `trajectory`, the loss of each
  step to `losses`)."""
  x, y = all_reduce_task.data()
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    spec = all_reduce_task.model_fn(tf.constant(x), tf.constant(y), "train",
                                    batch_norm)
    variables = tf1.global_variables()
    names = [v.op.name for v in variables]
    with tf1.Session() as session:
      tf1.train.Saver(variables).restore(session, initial_checkpoint)
      for _ in range(steps):
        loss, _ = session.run([spec.loss, spec.train_op])
        if losses is not None:
          losses.append(loss)
        if trajectory is not None:
          trajectory.append(dict(zip(names, session.run(variables))))
      return dict(zip(names, session.run(variables)))


def moving_average(initial, trajectory, name, decay):
  """numpy: the wrapper's EMA, decay_t = min(decay, (1 + t) / (10 + t))."""
  shadow = initial
  for t, values in enumerate(trajectory, start=1):
    decay_t = min(decay, (1.0 + t) / (10.0 + t))
    shadow = decay_t * shadow + (1.0 - decay_t) * values[name]
  return shadow


@pytest.mark.parametrize("rows,towers,extra", [
    # chief + 1 worker x 2 towers: 4 and 3 rows, one collective group.
    (["0:4", "4:7"], 2, {"all_reduce": "collective"}),
    # chief + 2 workers x 1 tower: 3/2/2 (the default, hierarchical).
    (["0:3", "3:5", "5:7"], 1, {}),
    # 2 towers per task, hierarchical by default; batch norm over every
    # task's towers (sync_batch_norm across tasks).
    (["0:4", "4:7"], 2, {"batch_norm": 1}),
])
def test_all_reduce_job_equals_one_device(tmp_path, rows, towers, extra):
  steps = 4
  codes = wait_all(start_job(tmp_path, rows, towers, steps, record_losses=1,
                             **extra))
  assert set(codes.values()) == {0}, codes
  chief = str(tmp_path / "chief0")
  losses = []
  expected = one_device(steps, f"{chief}/model.ckpt-0",
                        batch_norm="batch_norm" in extra, losses=losses)
  # The loss every task reports is the global batch's, every step (summed
  # over the tasks inside the gradients' all-reduce).
  for task in ("chief0", "worker0"):
    reported = json.loads((tmp_path / f"{task}_losses.json").read_text())
    np.testing.assert_allclose(reported, losses, rtol=1e-5, err_msg=task)
  reader = tf.train.load_checkpoint(chief)
  assert sorted(reader.get_variable_to_shape_map()) == sorted(expected)
  for name, value in expected.items():
    np.testing.assert_allclose(reader.get_tensor(name), value, atol=1e-5,
                               err_msg=name)
  assert reader.get_tensor("global_step") == steps
  assert not os.path.exists(tmp_path / "worker0" / "checkpoint")


def test_accumulation_and_ema_across_machines(tmp_path):
  """accumulate_steps=2 reads each task's (repeated) batch twice per update,
  which equals one step on it; every task keeps the same EMA."""
  steps = 3
  codes = wait_all(start_job(tmp_path, ["0:4", "4:7"], 2, steps,
                             accumulate_steps=2, ema_decay=0.5))
  assert set(codes.values()) == {0}, codes
  chief = str(tmp_path / "chief0")
  trajectory = []
  expected = one_device(steps, f"{chief}/model.ckpt-0", trajectory)
  reader = tf.train.load_checkpoint(chief)
  initial = tf.train.load_checkpoint(f"{chief}/model.ckpt-0")
  for name, value in expected.items():
    np.testing.assert_allclose(reader.get_tensor(name), value, atol=1e-5,
                               err_msg=name)
  for name in ("hidden/kernel", "out/bias"):
    shadow = f"{name}/ExponentialMovingAverage"
    want = moving_average(initial.get_tensor(shadow), trajectory, name, 0.5)
    np.testing.assert_allclose(reader.get_tensor(shadow), want, atol=1e-5,
                               err_msg=shadow)


def test_a_dead_worker_ends_the_job_within_the_peer_timeout(tmp_path):
  """The chief ends within the bound. Usually the health check (or the
  failed step) ends it with status 1 and one line naming the worker; on
  a loaded machine the chief's own job board may go silent first (its
  session broke with the peer): status 1 and one line saying a peer
  stopped; TensorFlow's own runtime sometimes crashes first on the broken
  connection (SIGSEGV/SIGABRT): still bounded, without the line."""
  tasks = start_job(tmp_path, ["0:4", "4:7"], 1, 100000,
                    peer_timeout_secs=10)
  time.sleep(25)  # both running steps by now (or waiting for each other).
  tasks[1][1].send_signal(signal.SIGKILL)
  codes = wait_all(tasks[:1], timeout=60)
  assert codes["chief:0"] in (1, -signal.SIGSEGV, -signal.SIGABRT), codes
  if codes["chief:0"] == 1:
    log = tasks[0][2].read_text()
    named = [line for line in log.splitlines()
             if "does not answer: it died or never started" in line]
    unnamed = [line for line in log.splitlines() if "this task's own job "
               "board has not answered" in line and "a peer stopped" in line]
    assert (len(named) == 1 and "task worker:0" in named[0] and
            not unnamed) or (len(unnamed) == 1 and not named), log[-2000:]


def test_a_restarted_job_resumes_from_the_chief_checkpoint(tmp_path):
  codes = wait_all(start_job(tmp_path, ["0:4", "4:7"], 1, 3))
  assert set(codes.values()) == {0}, codes
  codes = wait_all(start_job(tmp_path, ["0:4", "4:7"], 1, 6))
  assert set(codes.values()) == {0}, codes
  chief = str(tmp_path / "chief0")
  expected = one_device(6, f"{chief}/model.ckpt-0")
  reader = tf.train.load_checkpoint(chief)
  assert reader.get_tensor("global_step") == 6
  for name, value in expected.items():
    np.testing.assert_allclose(reader.get_tensor(name), value, atol=1e-5,
                               err_msg=name)


def test_train_py_all_reduce_job_through_the_launcher(tmp_path):
  """--num_ps 0: train.py's chief and worker all-reduce (2 towers each, a
  net larger than the linear one), the evaluator reports the metrics."""
  from test_distributed import run_launcher  # pylint: disable=g-import-not-at-top
  model_dir = str(tmp_path / "model")
  status, output, logs = run_launcher(
      tmp_path, "--num_ps", "0", "--num_workers", "2", "--evaluator", "--",
      "--model_name=mlp", "--max_steps=30", "--virtual_cpus=2",
      "--variable_update=replicated", f"--model_dir={model_dir}",
      "--save_checkpoints_steps=30")
  assert status == 0, output[-3000:]
  assert re.search(r"evaluator_0 final metrics: accuracy=\S+ "
                   r"global_step=30", output), output[-2000:]
  assert tf.train.load_checkpoint(model_dir).get_tensor("global_step") == 30
  assert "Training done" in open(f"{logs}/worker_1.log").read()
  assert ("given by the launcher (python -m estimator_multigpu.cluster."
          "launch)") in open(f"{logs}/worker_1.log").read()


def test_a_failed_step_with_a_dead_peer_ends_with_the_same_line():
  """TensorFlow may raise before the watch's timeout: the task still ends
  with one line naming the peer (here: nothing listens on the port)."""
  from estimator_multigpu.cluster.all_reduce import peer_probe  # pylint: disable=g-import-not-at-top
  port = launch.free_ports(1)[0]
  lines = []
  watch = peer_probe.PeerWatch({"worker:0": f"localhost:{port}"}, 60,
                           on_dead=lines.append)
  watch.end_if_a_peer_is_gone()
  assert len(lines) == 1 and lines[0].startswith(
      f"task worker:0 (localhost:{port}) does not answer")
