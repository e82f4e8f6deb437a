"""Several machines: ps tasks, workers and an evaluator on loopback ports.

Cluster runs are real processes (train.py, or tests/cluster/linear_cluster.py for
exact numbers) started by `estimator_multigpu.cluster.launch` or by hand; every
process is bounded by a timeout and killed in a `finally`.
"""

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
import types

from absl import flags
from absl.testing import flagsaver
import linear_cluster
import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu import cluster
from estimator_multigpu.cluster import launch
from estimator_multigpu.cluster.ps import job as ps_job

import classifier
from cli import cluster_task as cluster_task_lib
from cli import settings as settings_lib
from cli.flags import definitions as cli_flags
import train  # noqa: F401 (defines train.py's flags, which the tests parse)

tf1 = tf.compat.v1
FLAGS = flags.FLAGS
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
ENV.pop("TF_CONFIG", None)
TRAIN_FLAGS = ["--model_name=mlp", "--log_every_n_steps=10",
               "--save_summary_steps=1000", "--moving_average_decay=0.9",
               "--ps_linger_secs=20"]


# --- Tasks, TF_CONFIG and configs -------------------------------------------


def test_classic_flags_make_worker_0_the_chief():
  ps, workers = ["p0:1", "p1:1"], ["w0:1", "w1:1", "w2:1"]
  chief = cluster.task_from_flags(ps, workers, "worker", 0)
  assert (chief.type, chief.index, chief.is_chief) == ("chief", 0, True)
  assert chief.cluster == {"ps": ps, "chief": ["w0:1"],
                           "worker": ["w1:1", "w2:1"]}
  worker = cluster.task_from_flags(ps, workers, "worker", 2)
  assert worker.device == "/job:worker/task:1" and not worker.is_chief
  assert worker.trainers == ["chief:0", "worker:0", "worker:1"]
  assert cluster.task_from_flags(ps, workers, "ps", 1).device == (
      "/job:ps/task:1")
  assert json.loads(worker.tf_config()) == {
      "cluster": chief.cluster, "task": {"type": "worker", "index": 1}}


def test_tf_config_round_trips_and_a_local_one_is_none():
  task = cluster.task_from_flags(["p:1"], ["w:1"], "evaluator", 0)
  assert cluster.task_from_tf_config(task.tf_config()) == task
  assert cluster.task_from_tf_config('{"task": {"type": "worker"}}') is None
  assert cluster.resolve_task(None, None, None, 0, None) is None


@pytest.mark.parametrize("args,message", [
    (([], ["w:1"], "worker", 0), "--ps_hosts is empty"),
    ((["p:1"], ["w:1"], "chief", 0), "--job_name is 'chief'; expected ps"),
    ((["p:1"], ["w:1", "w:2"], "worker", 2),
     "--task_index=2 but --worker_hosts lists 2 address"),
])
def test_bad_cluster_flags_say_how_to_fix_them(args, message):
  with pytest.raises(ValueError, match=message):
    cluster.task_from_flags(*args)


@pytest.mark.parametrize("tf_config,message", [
    ("{cluster", "TF_CONFIG is not JSON"),
    ('{"cluster": {"master": ["m:1"], "ps": ["p:1"]}, "task": {"type": '
     '"master", "index": 0}}', "rename a `master` job to `chief`"),
    ('{"cluster": {"chief": ["c:1"]}, "task": {"type": "chief"}}',
     "0 ps; expected exactly one chief, at least one ps"),
    ('{"cluster": {"chief": ["c:1"], "ps": ["p:1"]}, "task": {"type": '
     '"worker", "index": 0}}', "Task worker:0 is not in the cluster"),
])
def test_bad_tf_config_is_a_clear_error(tf_config, message):
  with pytest.raises(ValueError, match=message):
    cluster.task_from_tf_config(tf_config)


def test_flags_and_tf_config_together_are_an_error():
  tf_config = cluster.task_from_flags(["p:1"], ["w:1"], "ps", 0).tf_config()
  with pytest.raises(ValueError, match="give only one"):
    cluster.resolve_task(["p:1"], ["w:1"], "worker", 0, tf_config)


def test_trainer_sees_only_the_ps_and_itself():
  base = emg.make_session_config(num_cpus=2)
  worker = cluster.task_from_flags(["p:1"], ["w:1", "w:2"], "worker", 1)
  config = cluster.session_config(worker, base)
  assert list(config.device_filters) == ["/job:ps", "/job:worker/task:0"]
  assert config.device_count["CPU"] == 2 and not base.device_filters
  server = cluster.server_config(worker, config)
  assert server.device_count["CPU"] == 2 and not server.device_filters
  ps = cluster.task_from_flags(["p:1"], ["w:1"], "ps", 0)
  assert cluster.server_config(ps, base).device_count["GPU"] == 0


@pytest.fixture(name="parsed_flags")
def fixture_parsed_flags():
  if not FLAGS.is_parsed():
    FLAGS(["test"])
  with flagsaver.flagsaver():
    yield


def _cluster_task():
  """This process's task, as train.py's main builds it from the flags."""
  cluster = cli_flags.read(settings_lib.ClusterSettings)
  return cluster_task_lib.cluster_task(cluster, None), cluster


@pytest.mark.usefixtures("parsed_flags")
def test_train_py_reads_cluster_flags():
  FLAGS.ps_hosts, FLAGS.worker_hosts = ["p:1"], ["w0:1", "w1:1"]
  FLAGS.job_name, FLAGS.task_index, FLAGS.sync_replicas = "worker", 1, True
  task, cluster = _cluster_task()
  assert task.device == "/job:worker/task:0"
  assert cluster_task_lib.trainer_number(task) == 1  # its own input shuffle.
  assert cluster_task_lib.replicas_to_aggregate(
      task, cluster.sync_replicas) == 2
  FLAGS.ps_hosts = FLAGS.worker_hosts = FLAGS.job_name = None
  with pytest.raises(ValueError, match="--sync_replicas synchronizes"):
    _cluster_task()


def test_sync_replicas_config_is_checked():
  with pytest.raises(ValueError, match="`sync_replicas` is -1; expected 0"):
    classifier.ClassifierConfig(sync_replicas=-1)


@pytest.mark.parametrize("is_chief", [True, False])
def test_with_sync_replicas_only_the_chief_updates_the_average(is_chief):
  config = types.SimpleNamespace(is_chief=is_chief, session_config=(
      emg.make_session_config(num_cpus=2)))
  x, y = linear_cluster.shard(0)
  with tf.Graph().as_default() as graph:
    tf1.train.get_or_create_global_step()
    emg.multi_gpu(linear_cluster.model_fn, devices=["/cpu:0", "/cpu:1"],
                  ema_decay=0.9)(tf.constant(x), tf.constant(y), "train",
                                 {"replicas": 2}, config)
  averages = [op.name for op in graph.get_operations()
              if "ExponentialMovingAverage" in op.name]
  assert bool(averages) == is_chief


# --- Placement inside Estimator's replica_device_setter ---------------------


class GraphBuilt(Exception):
  """Raised by `CaptureGraph` once Estimator has built the training graph."""


class CaptureGraph(tf1.train.SessionRunHook):

  def begin(self):
    raise GraphBuilt([(op.type, op.name, op.device)
                      for op in tf1.get_default_graph().get_operations()])


def linear_model_fn(features, labels, mode):
  w = tf1.get_variable("w", [3, 2])
  b = tf1.get_variable("b", [2])
  loss = tf.reduce_mean(tf.square(tf.matmul(features, w) + b - labels))
  optimizer = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.1, 0.9))
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=(
      optimizer.minimize(loss, tf1.train.get_global_step())))


def graph_built_for(task, model_dir, monkeypatch):
  """(type, name, device) of every op Estimator builds for `task`."""
  monkeypatch.setenv("TF_CONFIG", task.tf_config())
  config = cluster.session_config(task, emg.make_session_config(num_cpus=2))
  estimator = tf.estimator.Estimator(
      emg.multi_gpu(linear_model_fn, devices=["/cpu:0", "/cpu:1"],
                    ema_decay=0.9),
      config=tf.estimator.RunConfig(model_dir=model_dir,
                                    session_config=config))
  zeros = (np.zeros([4, 3], np.float32), np.zeros([4, 2], np.float32))
  input_fn = lambda: tf.data.Dataset.from_tensors(zeros).repeat()
  with pytest.raises(GraphBuilt) as built:
    estimator.train(input_fn, max_steps=1, hooks=[CaptureGraph()])
  return built.value.args[0]


@pytest.mark.parametrize("job,index,device", [
    ("worker", 0, "/job:chief/task:0"), ("worker", 1, "/job:worker/task:0")])
def test_variables_on_ps_towers_and_gradient_sum_on_the_worker(
    job, index, device, tmp_path, monkeypatch):
  task = cluster.task_from_flags(["p0:1", "p1:1"], ["w0:1", "w1:1"], job,
                                 index)
  ops = graph_built_for(task, str(tmp_path), monkeypatch)
  devices = {name: dev for _, name, dev in ops}
  variables = {name: dev for kind, name, dev in ops if kind == "VarHandleOp"}
  # global_step, w, b, their Momentum slots and moving averages.
  assert {"global_step", "w", "b", "w/Momentum",
          "w/ExponentialMovingAverage"} <= set(variables)
  assert all(dev.startswith("/job:ps/task:") for dev in variables.values())
  assert {dev[:len("/job:ps/task:0")] for dev in variables.values()} == {
      "/job:ps/task:0", "/job:ps/task:1"}  # spread over both ps tasks.
  for name in ("w", "b"):  # slot, average and update next to the variable.
    home = variables[name]
    assert variables[f"{name}/Momentum"] == home
    assert variables[f"{name}/ExponentialMovingAverage"] == home
    assert devices[f"Momentum/update_{name}/ResourceApplyMomentum"] == home
  assert devices["MatMul"] == f"{device}/device:CPU:0"  # tower 0.
  assert devices["tower_1/MatMul"] == f"{device}/device:CPU:1"
  sums = [dev for kind, name, dev in ops
          if kind == "AddN" and name.startswith("tower_gradients/")]
  assert len(sums) == 2 and set(sums) == {f"{device}/device:CPU:0"}


# --- Real clusters -----------------------------------------------------------


def run_launcher(tmp_path, *args, timeout=240):
  """Runs the launcher; returns (status, output, log dir).

  The launcher stops its tasks itself after `timeout - 60` s; past
  `timeout`, SIGTERM makes it stop them (SIGKILL would orphan them).
  """
  log_dir = str(tmp_path / "logs")
  launcher = subprocess.Popen(
      [sys.executable, "-m", "estimator_multigpu.cluster.launch", "--log_dir",
       log_dir, "--timeout_secs", str(timeout - 60), "--grace_secs", "40",
       *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      cwd=ROOT, env=ENV)
  try:
    output, _ = launcher.communicate(timeout=timeout)
  finally:
    if launcher.poll() is None:
      launcher.terminate()
      launcher.communicate(timeout=60)
  return launcher.returncode, output, log_dir


def read(path):
  with open(path) as f:
    return f.read()


def checkpoint_step(model_dir):
  return int(tf.train.load_checkpoint(str(model_dir)).get_tensor(
      "global_step"))


def eval_steps(model_dir, tag="accuracy"):
  steps = []
  for path in glob.glob(os.path.join(model_dir, "eval", "events.out.*")):
    for event in tf1.train.summary_iterator(path):
      if any(value.tag == tag for value in event.summary.value):
        steps.append(event.step)
  return steps


@pytest.mark.slow
def test_async_cluster_from_tf_config_with_an_evaluator(tmp_path):
  model_dir = str(tmp_path / "model")
  status, output, logs = run_launcher(
      tmp_path, "--num_ps", "1", "--num_workers", "2", "--evaluator",
      "--tf_config", "--", *TRAIN_FLAGS, f"--model_dir={model_dir}",
      "--max_steps=100", "--save_checkpoints_steps=50",
      "--eval_timeout_secs=120")
  assert status == 0, output[-3000:]
  assert "job status 0" in output and "stopped by the launcher" not in output
  # Asynchronous: StopAtStepHook reads global_step in the same run as the
  # update, so it can be one behind; each of the 2 workers may then apply
  # one update past max_steps before it sees the stop: at most 100 + 2.
  assert 100 <= checkpoint_step(model_dir) <= 102
  names = dict(tf.train.list_variables(model_dir))
  assert "MLP/fc1/weights/ExponentialMovingAverage" in names
  for name in ("ps_0", "worker_0", "worker_1", "evaluator_0"):
    assert os.path.exists(os.path.join(logs, f"{name}.log"))
  assert "the job is finished; exiting" in read(f"{logs}/ps_0.log")
  assert "Training done" in read(f"{logs}/worker_1.log")
  assert "Skipping cancelled dequeue" not in read(f"{logs}/ps_0.log")
  # The launcher shows the evaluator's last metrics line and the logs.
  assert re.search(r"evaluator_0 final metrics: accuracy=\S+ global_step=",
                   output), output[-2000:]
  assert f"logs in {logs}" in output
  assert max(eval_steps(model_dir)) >= 100  # the chief's last checkpoint.
  assert "accuracy=" in read(f"{logs}/evaluator_0.log")


@pytest.mark.slow
def test_sync_cluster_averages_both_workers_gradients(tmp_path):
  model_dir = str(tmp_path / "model")
  status, output, _ = run_launcher(
      tmp_path, "--script", "tests/cluster/linear_cluster.py", "--", "--sync_replicas",
      f"--model_dir={model_dir}", "--max_steps=20")
  assert status == 0, output[-3000:]
  reader = tf.train.load_checkpoint(model_dir)
  assert reader.get_tensor("global_step") == 20
  want_w, want_average = linear_cluster.expected(num_trainers=2, steps=20)
  np.testing.assert_allclose(reader.get_tensor("w"), want_w, atol=1e-5)
  np.testing.assert_allclose(
      reader.get_tensor("w/ExponentialMovingAverage"), want_average,
      atol=1e-5)
  one_worker, _ = linear_cluster.expected(num_trainers=1, steps=20)
  assert np.abs(one_worker - want_w).max() > 0.1  # the check can fail.


class Tasks:
  """Cluster tasks started by hand; `stop()` kills whatever still runs."""

  def __init__(self, tmp_path, ports, *args):
    self._dir, self._args = tmp_path, list(args)
    self._hosts = [f"localhost:{port}" for port in ports]
    self.processes = []

  def start(self, job, index, name):
    flags_ = [f"--ps_hosts={self._hosts[0]}",
              f"--worker_hosts={','.join(self._hosts[1:])}",
              f"--job_name={job}", f"--task_index={index}"]
    with open(self._dir / f"{name}.log", "w") as log:
      process = subprocess.Popen(
          [sys.executable, os.path.join(ROOT, "train.py"), *self._args,
           *flags_], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=ENV,
          start_new_session=True)
    self.processes.append(process)
    return process

  def log(self, name):
    return read(self._dir / f"{name}.log")

  def stop(self):
    for process in self.processes:
      if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def last_step_logged(log):
  steps = re.findall(r"\] step (\d+) ", log)
  return int(steps[-1]) if steps else -1


def wait_until(condition, timeout, what):
  """Polls `condition`; a hang guard, not a speed claim: raises TimeoutError
  after `timeout` seconds."""
  deadline = time.monotonic() + timeout
  while not condition():
    if time.monotonic() >= deadline:
      raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
    time.sleep(0.2)


@pytest.mark.slow
def test_sync_job_finishes_after_a_worker_is_killed_and_restarted(tmp_path):
  model_dir = str(tmp_path / "model")
  tasks = Tasks(tmp_path, launch.free_ports(3), *TRAIN_FLAGS,
                f"--model_dir={model_dir}", "--max_steps=400",
                "--save_checkpoints_steps=100000", "--sync_replicas")
  try:
    ps, chief = tasks.start("ps", 0, "ps"), tasks.start("worker", 0, "chief")
    worker = tasks.start("worker", 1, "worker")
    wait_until(lambda: last_step_logged(tasks.log("worker")) >= 20, 120,
               "the worker's 20th step")
    os.killpg(worker.pid, signal.SIGKILL)
    assert worker.wait(timeout=30) == -signal.SIGKILL
    restarted = tasks.start("worker", 1, "restarted")
    for process in (restarted, chief, ps):
      assert process.wait(timeout=150) == 0, tasks.log("chief")[-3000:]
  finally:
    tasks.stop()
  # Without the restarted worker no step could be aggregated: it rejoined.
  assert checkpoint_step(model_dir) == 400
  assert "Training done" in tasks.log("restarted")
  assert "chief:0 stopped (ok)" in tasks.log("ps")


@pytest.mark.slow
def test_unreachable_ps_is_a_clear_error_after_a_bounded_wait(tmp_path):
  ps_port, worker_port = launch.free_ports(2)
  # Bounded: the run ends by itself (else subprocess.run's timeout raises)
  # and its error states the 3 s it waited.
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "train.py"), "--model_name=mlp",
       f"--model_dir={tmp_path}", f"--ps_hosts=localhost:{ps_port}",
       f"--worker_hosts=localhost:{worker_port}", "--job_name=worker",
       "--ps_wait_secs=3"], capture_output=True, text=True, timeout=120,
      cwd=ROOT, env=ENV)
  assert result.returncode == 1, result.stderr[-2000:]
  assert (f"waited 3 s for ps task 0 at localhost:{ps_port}, which did not "
          "answer") in result.stderr
  # The first line and the error name where the cluster came from.
  assert "given by the cluster flags (--ps_hosts" in result.stderr
  assert "run without --ps_hosts, --worker_hosts" in result.stderr


def test_watchdog_reports_a_ps_that_stops_answering():
  # Nothing listens on the ps port: it has "not answered" since the start.
  ps_port, worker_port = launch.free_ports(2)
  task = cluster.task_from_flags([f"localhost:{ps_port}"],
                                 [f"localhost:{worker_port}"], "worker", 0)
  lost, start = [], time.monotonic()
  with ps_job.PsWatchdog(task, patience_secs=1.0, probe_secs=0.2,
                              on_lost=lambda *args: lost.append(args)):
    wait_until(lambda: lost, 30, "the watchdog's report")
  [(index, silent)] = lost
  # The watchdog's own report: it waited out its patience, and never reports
  # more silence than has passed.
  elapsed = time.monotonic() - start
  assert index == 0 and 1.0 <= silent <= elapsed


@pytest.mark.slow
def test_trainer_exits_when_its_ps_dies_mid_job(tmp_path):
  model_dir = str(tmp_path / "model")
  tasks = Tasks(tmp_path, launch.free_ports(2), *TRAIN_FLAGS,
                f"--model_dir={model_dir}", "--max_steps=1000000",
                "--ps_wait_secs=5")
  try:
    ps, chief = tasks.start("ps", 0, "ps"), tasks.start("worker", 0, "chief")
    wait_until(lambda: last_step_logged(tasks.log("chief")) >= 20, 120,
               "the chief's 20th step")
    os.killpg(ps.pid, signal.SIGKILL)
    # It exits instead of hanging (chief.wait's timeout bounds the wait).
    assert chief.wait(timeout=90) == 1, tasks.log("chief")[-3000:]
  finally:
    tasks.stop()
  # After 5 s of patience, not TensorFlow's own (unbounded) retries.
  assert re.search(r"ps task 0 at localhost:\d+ has not answered for \d+ s "
                   "while training", tasks.log("chief"))


@pytest.mark.slow
def test_launcher_stops_every_task_when_the_chief_fails(tmp_path):
  # Only the chief writes the model dir: an unwritable one fails it alone
  # (a bad flag would fail every task while parsing).
  status, output, logs = run_launcher(
      tmp_path, "--num_workers", "1", "--",
      "--model_dir=/proc/estimator_multigpu_test", timeout=150)
  assert status == 2, output[-3000:]  # the chief's: a model dir mistake.
  assert "worker_0 (chief): exit status 2" in output
  assert "ps_0: stopped by the launcher" in output  # was serving, now gone.
  assert "--model_dir=/proc/estimator_multigpu_test cannot be written" in (
      read(f"{logs}/worker_0.log"))


def test_launcher_arguments(capsys):
  ports = launch.free_ports(5)
  assert len(set(ports)) == 5
  script = ["--script", os.path.join(ROOT, "train.py")]
  with pytest.raises(SystemExit):
    launch.parse_args([*script, "--", "--job_name=ps"])
  assert "the launcher sets the cluster flags" in capsys.readouterr().err
  args, script_args = launch.parse_args([*script, "--num_ps", "2", "--",
                                         "--x=1"])
  assert (args.num_ps, args.num_workers, script_args) == (2, 2, ["--x=1"])


def test_launcher_summary_shows_the_evaluators_metrics_and_the_logs(
    tmp_path):
  log = tmp_path / "evaluator_0.log"
  log.write_text("I1123 evaluation.py:68] Evaluated ckpt-100: {...}\n"
                 "accuracy=0.9000 global_step=50 loss=0.3000\n"
                 "accuracy=0.9500 global_step=100 loss=0.2000 top_5=1.0000\n"
                 "I1123 task.py:1] exiting\n")
  assert launch.final_metrics(str(log)) == (
      "accuracy=0.9500 global_step=100 loss=0.2000 top_5=1.0000")
  done = types.SimpleNamespace(poll=lambda: 0)
  tasks = [launch.TaskProcess("worker_0", "worker", "w.log", done),
           launch.TaskProcess("evaluator_0", "evaluator", str(log), done)]
  text = launch.summary(tasks, str(tmp_path))
  assert "evaluator_0 final metrics: accuracy=0.9500 global_step=100" in text
  assert text.endswith(f"logs in {tmp_path}")
  assert launch.final_metrics(str(tmp_path / "missing.log")) is None


def test_workers_without_ps_make_an_all_reduce_cluster():
  workers = ["w0:1", "w1:1", "w2:1"]
  chief = cluster.task_from_flags([], workers, "worker", 0)
  assert chief.cluster == {"chief": ["w0:1"], "worker": ["w1:1", "w2:1"]}
  assert chief.all_reduce and chief.is_chief and chief.ps_hosts == []
  config = cluster.session_config(chief, None)
  assert list(config.device_filters) == []  # every task sees every task.
  assert not cluster.task_from_flags(["p:1"], workers, "worker", 0).all_reduce
