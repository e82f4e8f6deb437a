"""Faults of an all-reduce job (chief + workers, no ps) on loopback.

Real processes, real signals: a restart after a crash resumes, a stopped or
stuck peer ends every task with one line, tasks that disagree are refused
before the first step, a stop signal ends a task within its grace time.
Every wait is bounded (the timeout + 60 s) and every process is killed in a
`finally`; no test asserts on time.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import tensorflow as tf
from test_all_reduce_cluster import TASK
from test_all_reduce_cluster import wait_all
from test_distributed import checkpoint_step
from test_distributed import ENV
from test_distributed import last_step_logged
from test_distributed import ROOT
from test_distributed import run_launcher
from test_distributed import wait_until

from estimator_multigpu.cluster import launch

pytestmark = pytest.mark.slow
TRAIN_FLAGS = ["--model_name=mlp", "--virtual_cpus=2", "--log_every_n_steps=1",
               "--variable_update=replicated", "--save_summary_steps=1000"]


class TrainTasks:
  """train.py's chief and worker started by hand (classic flags)."""

  def __init__(self, tmp_path, *args):
    ports = launch.free_ports(2)
    self.hosts = ",".join(f"localhost:{port}" for port in ports)
    self.dir, self.args, self.processes = tmp_path, list(args), {}

  def start(self, index, *args, token=None):
    name = "chief" if index == 0 else f"worker{index}"
    env = {**ENV, "EMG_JOB_TOKEN": token} if token else ENV
    with open(self.dir / f"{name}.log", "w") as log:
      self.processes[name] = subprocess.Popen(
          [sys.executable, os.path.join(ROOT, "train.py"), *TRAIN_FLAGS,
           *self.args, *args, f"--worker_hosts={self.hosts}",
           "--job_name=worker", f"--task_index={index}"],
          stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
          start_new_session=True)
    return self.processes[name]

  def log(self, name):
    return (self.dir / f"{name}.log").read_text()

  def stop(self):
    for process in self.processes.values():
      if process.poll() is None:
        os.killpg(process.pid, signal.SIGCONT)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def error_lines(log):
  return [line for line in log.splitlines() if line.startswith("E1")]


def test_train_py_resumes_after_a_crash_and_stops_at_max_steps(tmp_path):
  model_dir = str(tmp_path / "model")
  tasks = TrainTasks(tmp_path, f"--model_dir={model_dir}",
                     "--save_checkpoints_steps=5")
  try:
    tasks.start(0, "--max_steps=100000"), tasks.start(1, "--max_steps=100000")
    wait_until(lambda: os.path.exists(f"{model_dir}/checkpoint") and
               checkpoint_step(model_dir) >= 10, 180, "a checkpoint at 10")
  finally:
    tasks.stop()  # SIGKILL: a crash.
  crashed_at = checkpoint_step(model_dir)
  flags = ["--num_ps", "0", "--num_workers", "2", "--", *TRAIN_FLAGS,
           f"--model_dir={model_dir}", "--save_checkpoints_steps=5"]
  status, output, logs = run_launcher(
      tmp_path / "resumed", *flags, f"--max_steps={crashed_at + 6}")
  assert status == 0, output[-3000:]
  assert checkpoint_step(model_dir) == crashed_at + 6
  chief = open(f"{logs}/worker_0.log").read()
  assert last_step_logged(chief) == crashed_at + 6 - 1, chief[-2000:]
  # Already there: every task says so in one line and exits.
  status, output, logs = run_launcher(
      tmp_path / "again", *flags, f"--max_steps={crashed_at + 6}")
  assert status == 0, output[-3000:]
  for name in ("worker_0", "worker_1"):
    log = open(f"{logs}/{name}.log").read()
    assert log.count("nothing to train") == 1, log[-2000:]
    assert "Training done" not in log
  assert checkpoint_step(model_dir) == crashed_at + 6


def test_a_stopped_worker_is_found_by_its_heartbeat(tmp_path):
  tasks = TrainTasks(tmp_path, f"--model_dir={tmp_path / 'model'}",
                     "--max_steps=100000", "--peer_timeout_secs=10",
                     "--save_checkpoints_steps=100000")
  try:
    chief, worker = tasks.start(0), tasks.start(1)
    wait_until(lambda: last_step_logged(tasks.log("chief")) >= 5, 180,
               "the chief's 5th step")
    os.killpg(worker.pid, signal.SIGSTOP)  # its port still accepts.
    assert chief.wait(timeout=70) == 1, tasks.log("chief")[-3000:]
    os.killpg(worker.pid, signal.SIGCONT)
    assert worker.wait(timeout=70) == 1, tasks.log("worker1")[-3000:]
  finally:
    tasks.stop()
  errors = error_lines(tasks.log("chief"))
  assert len(errors) == 1, errors
  assert "task worker --task_index=1 has made no progress" in errors[0]
  assert len(error_lines(tasks.log("worker1"))) == 1


def start_tasks(tmp_path, extras, steps, cluster=None, **common):
  """all_reduce_task.py as chief + workers, task k with its `extras[k]`
  flags and rows of the 7-example batch; `cluster`: {task: TF_CONFIG
  cluster} overrides. Returns [(name, Popen, log path)]."""
  ports = launch.free_ports(len(extras))
  lists = {"chief": [f"localhost:{ports[0]}"],
           "worker": [f"localhost:{p}" for p in ports[1:]]}
  names = [("chief", 0)] + [("worker", i) for i in range(len(ports) - 1)]
  bounds = [round(7 * k / len(extras)) for k in range(len(extras) + 1)]
  tasks = []
  for k, ((job, index), extra) in enumerate(zip(names, extras)):
    tf_config = {"cluster": (cluster or {}).get(k, lists),
                 "task": {"type": job, "index": index}}
    flags = {**common, **extra, "rows": f"{bounds[k]}:{bounds[k + 1]}",
             "model_dir": tmp_path / f"{job}{index}", "steps": steps}
    log = tmp_path / f"{job}{index}.log"
    with open(log, "w") as out:
      tasks.append((f"{job}:{index}", subprocess.Popen(
          [sys.executable, TASK, *[f"--{key}={value}" for key, value in
                                   flags.items()]],
          env={**ENV, "TF_CONFIG": json.dumps(tf_config),
               "PYTHONPATH": ROOT}, stdout=out,
          stderr=subprocess.STDOUT, start_new_session=True), log))
  return tasks


def codes_then_kill(tasks, timeout, wait_for=None):
  """The exit codes of `wait_for` (default: every task), then every task's
  processes killed (whatever the wait ended with)."""
  try:
    return wait_all(wait_for or tasks, timeout=timeout)
  finally:
    kill(tasks)


def kill(tasks):
  for _, process, _ in tasks:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
      process.wait(timeout=30)


def test_no_false_alarm_while_a_task_builds_saves_or_evaluates(tmp_path):
  """A peer timeout of 3 s; the worker takes 8 s to build its graph, then
  pauses 8 s after its 2nd step (as a long save or evaluation would)."""
  tasks = start_tasks(tmp_path, [{}, {"build_delay_secs": 8,
                                      "pause_at_step": 2, "pause_secs": 8}],
                      5, peer_timeout_secs=3)
  codes = codes_then_kill(tasks, 180)
  assert set(codes.values()) == {0}, [t[2].read_text()[-2000:] for t in tasks]
  assert tf.train.load_checkpoint(str(tmp_path / "chief0")).get_tensor(
      "global_step") == 5


def test_a_stuck_step_ends_every_task(tmp_path):
  """The worker's input hangs in its 3rd batch: the chief waits for it in
  the all-reduce; both end with the one line."""
  tasks = start_tasks(tmp_path, [{}, {"stuck_at_step": 3}], 100000,
                      peer_timeout_secs=4)
  codes = codes_then_kill(tasks, 150)
  assert codes == {"chief:0": 1, "worker:0": 1}, codes
  for _, _, log in tasks:
    errors = [line for line in log.read_text().splitlines()
              if "no task has finished a step for" in line]
    assert len(errors) == 1, log.read_text()[-2000:]


def test_tasks_that_disagree_are_refused_by_name(tmp_path):
  """Another tower count (the graph's), then another cluster list."""
  tasks = start_tasks(tmp_path, [{"towers": 1}, {"towers": 2}], 5)
  codes = codes_then_kill(tasks, 150)
  assert codes == {"chief:0": 1, "worker:0": 1}, codes
  for _, _, log in tasks:
    assert re.search(r"Tasks disagree on towers per task \(graph\): [12] on "
                     r"(chief|worker):0, [12] on (chief|worker):0",
                     log.read_text()), log.read_text()[-2000:]


def test_cluster_lists_that_differ_are_named_as_such(tmp_path):
  ports = launch.free_ports(3)
  small = {"chief": [f"localhost:{ports[0]}"],
           "worker": [f"localhost:{ports[1]}"]}
  large = {**small, "worker": small["worker"] + [f"localhost:{ports[2]}"]}
  tasks = start_tasks(tmp_path, [{}, {}], 5, cluster={0: small, 1: large})
  codes = codes_then_kill(tasks, 150, wait_for=tasks[:1])
  assert codes == {"chief:0": 1}, codes
  assert "The TF_CONFIG cluster lists differ" in tasks[0][2].read_text()


def test_train_py_tasks_with_another_split_are_refused(tmp_path):
  """The worker would train on the held-out split (was silent); the chief
  gives the default split, which resolves to the same 'train' as the
  worker's explicit one would (test_job_checks covers that)."""
  tasks = TrainTasks(tmp_path, f"--model_dir={tmp_path / 'model'}",
                     "--max_steps=20")
  try:
    chief = tasks.start(0)
    worker = tasks.start(1, "--dataset_split_name=eval")
    assert chief.wait(timeout=180) == 1 and worker.wait(timeout=60) == 1
  finally:
    tasks.stop()
  for name in ("chief", "worker1"):
    errors = error_lines(tasks.log(name))
    assert len(errors) == 1, tasks.log(name)[-2000:]
    assert "Tasks disagree on --dataset_split_name" in errors[0]
    assert "'train' on worker --task_index=0 (the chief)" in errors[0]
    assert "'eval' on worker --task_index=1" in errors[0]


def test_sigterm_ends_a_chief_blocked_in_the_all_reduce(tmp_path):
  """The worker is stopped (SIGSTOP), so the chief's step waits in the
  all-reduce; SIGTERM ends it after --stop_grace_secs, without a final
  checkpoint, saying so (no IndexError: there is no ps)."""
  tasks = TrainTasks(tmp_path, f"--model_dir={tmp_path / 'model'}",
                     "--max_steps=100000", "--peer_timeout_secs=600",
                     "--stop_grace_secs=3", "--save_checkpoints_steps=100000")
  try:
    chief, worker = tasks.start(0), tasks.start(1)
    wait_until(lambda: last_step_logged(tasks.log("chief")) >= 5, 180,
               "the chief's 5th step")
    os.killpg(worker.pid, signal.SIGSTOP)
    time.sleep(3)  # the chief's next step now waits for the worker.
    os.kill(chief.pid, signal.SIGTERM)
    assert chief.wait(timeout=60) == 128 + signal.SIGTERM, (
        tasks.log("chief")[-3000:])
  finally:
    tasks.stop()
  log = tasks.log("chief")
  assert "IndexError" not in log
  assert re.search(r"SIGTERM arrived \d+ s ago, but this task has not "
                   r"stopped.*Exiting without a final checkpoint", log), (
                       log[-2000:])


@pytest.mark.parametrize("stopped", ["chief", "worker1"])
def test_sigterm_to_any_task_stops_the_job_with_the_newest_step_saved(
    tmp_path, stopped):
  """The job agrees on one last step; the chief saves it; every task ends
  with 128 + SIGTERM and one line naming the signal, the task and the
  step saved (no "checkpoint saved" claim on a worker)."""
  model_dir = tmp_path / "model"
  tasks = TrainTasks(tmp_path, f"--model_dir={model_dir}",
                     "--max_steps=100000", "--save_checkpoints_steps=100000")
  try:
    # auto resolves to the chief's replicated: the tasks agree.
    tasks.start(0), tasks.start(1, "--variable_update=auto")
    wait_until(lambda: last_step_logged(tasks.log("chief")) >= 5, 180,
               "the chief's 5th step")
    os.kill(tasks.processes[stopped].pid, signal.SIGTERM)
    codes = {name: process.wait(timeout=90)
             for name, process in tasks.processes.items()}
  finally:
    tasks.stop()
  assert codes == {"chief": 128 + signal.SIGTERM,
                   "worker1": 128 + signal.SIGTERM}, codes
  saved = checkpoint_step(model_dir)
  assert saved > 5
  who = {"chief": "worker --task_index=0 (the chief)",
         "worker1": "worker --task_index=1"}[stopped]
  for name in ("chief", "worker1"):
    log = tasks.log(name)
    lines = [line for line in log.splitlines() if "The job stopped" in line]
    assert len(lines) == 1, log[-3000:]
    assert f"The job stopped on SIGTERM to task {who}" in lines[0]
    assert f"the chief saved checkpoint {saved} in" in lines[0], lines
    assert not error_lines(log), error_lines(log)
    assert "Stopped by signal" not in log


def test_a_port_in_use_names_the_address(tmp_path):
  with socket.socket() as taken:
    taken.bind(("localhost", 0))
    taken.listen()
    port = taken.getsockname()[1]
    tasks = start_tasks(tmp_path, [{}, {}], 5, cluster={0: {
        "chief": [f"localhost:{port}"],
        "worker": [f"localhost:{launch.free_ports(1)[0]}"]}})
    codes = codes_then_kill(tasks, 120, wait_for=tasks[:1])
  assert codes["chief:0"] != 0
  assert f"cannot listen on its address localhost:{port}" in (
      tasks[0][2].read_text()), tasks[0][2].read_text()[-2000:]


def test_a_checkpoint_the_chief_cannot_write_is_named_on_every_task(
    tmp_path):
  """The chief's save of step 20 fails (its files cannot be written: a
  directory stands where the checkpoint's index goes, as a read-only model
  dir would): the chief's line and the worker's name that write, not the
  lock file or the chief's absence."""
  model_dir = tmp_path / "model"
  tasks = TrainTasks(tmp_path, f"--model_dir={model_dir}",
                     "--max_steps=100000", "--save_checkpoints_steps=20")
  try:
    tasks.start(0), tasks.start(1)
    wait_until(lambda: last_step_logged(tasks.log("chief")) >= 2, 180,
               "the chief's 2nd step")
    (model_dir / "model.ckpt-20.index").mkdir()
    codes = {name: process.wait(timeout=120)
             for name, process in tasks.processes.items()}
  finally:
    tasks.stop()
  assert codes["chief"] != 0 and codes["worker1"] == 1, codes
  chief, worker = tasks.log("chief"), tasks.log("worker1")
  assert "model.ckpt-20" in chief.splitlines()[-1], chief[-2000:]
  assert "train.lock" not in chief.splitlines()[-1]
  lines = error_lines(worker)
  assert len(lines) == 1, worker[-3000:]
  assert "task worker --task_index=0 (the chief) failed:" in lines[0]
  assert "model.ckpt-20" in lines[0], lines
