"""Strays beside a healthy all-reduce job, and a TF_CONFIG left over.

Real train.py processes on loopback (127.0.0.1), each task given its
cluster by TF_CONFIG: one healthy job (chief + worker) keeps training while,
in turn, a stray task (a worker or a chief of another job whose TF_CONFIG
names this job's chief, or worker; a worker with this job's token but
other settings) starts, is refused in one line and ends; after each the
job's step keeps growing for twice the peer timeout (checked while the
next stray starts), and no session of the job was dropped on the way (its
board is reached at the chief's address: `board.Board`). Then a chief whose
TF_CONFIG names a worker that never starts (a TF_CONFIG left in the shell)
ends, naming TF_CONFIG and how to train alone, and leaves no lock. Every
wait is bounded and every process is killed in a `finally`; no test
asserts on time.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from test_all_reduce_faults import error_lines
from test_distributed import ENV
from test_distributed import last_step_logged
from test_distributed import ROOT
from test_distributed import wait_until

from estimator_multigpu.cluster import launch

pytestmark = pytest.mark.slow
TIMEOUT_SECS = 5  # every task's --peer_timeout_secs.
# Steps of some 0.2 s (96 x 96 images, a batch of 1024): every collective
# leaves a thread for its 600 s timeout (`collectives.TIMEOUT_SECONDS`), so
# faster steps would take thousands of the machine's threads in a minute.
FLAGS = ["--model_name=mlp", "--virtual_cpus=1", "--batch_size=1024",
         "--image_size=96", "--log_every_n_steps=2",
         "--variable_update=replicated", "--save_summary_steps=100000",
         "--save_checkpoints_steps=100000", "--max_steps=100000",
         f"--peer_timeout_secs={TIMEOUT_SECS}"]
# A line of this project's (Python's absl); TensorFlow's C++ lines have the
# same form (from TF 2.17 some before any flag is read) but no `.py`.
_ABSL_LINE = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ \S+\.py:\d+\] ")


class Tasks:
  """train.py tasks, each with its own TF_CONFIG, token and log."""

  def __init__(self, tmp_path):
    self.dir, self.processes = tmp_path, {}

  def start(self, name, cluster, task_type, token, *flags, job=None,
            nice=0):
    """Task `name` of job `job` (its model dir; default: its own); `nice`:
    its niceness (the healthy job's, so that a stray's start is not slowed
    down by the job's steps on a machine of few cores)."""
    tf_config = json.dumps({"cluster": cluster,
                            "task": {"type": task_type, "index": 0}})
    env = {**ENV, "TF_CONFIG": tf_config, "EMG_JOB_TOKEN": token}
    with open(self.dir / f"{name}.log", "w") as log:
      self.processes[name] = subprocess.Popen(
          [sys.executable, os.path.join(ROOT, "train.py"), *FLAGS,
           f"--model_dir={self.dir / (job or name)}", *flags], stdout=log,
          stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True,
          preexec_fn=lambda: os.nice(nice))
    return self.processes[name]

  def log(self, name):
    return (self.dir / f"{name}.log").read_text()

  def steps(self):
    return last_step_logged(self.log("chief"))

  def stop(self):
    for process in self.processes.values():
      if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


class Growth:
  """The healthy job lives on, and at one and at two peer timeouts after
  each stray ended its step is past the step seen one timeout before (a
  broken board ends it within one); the next stray may start meanwhile."""

  def __init__(self, tasks):
    self.tasks, self.due = tasks, []  # [when, the step to pass, checks left]

  def stray_ended(self):
    self.due.append([time.monotonic() + TIMEOUT_SECS, self.tasks.steps(), 2])

  def wait(self, process=None, timeout=120):
    """Until `process` ends (None: until every check is made)."""
    deadline = time.monotonic() + timeout
    while process.poll() is None if process else self.due:
      assert time.monotonic() < deadline, "a hang: 120 s"
      self._check()
      time.sleep(0.2)

  def _check(self):
    codes = {name: self.tasks.processes[name].poll() for name in ("chief",
                                                                  "worker")}
    assert codes == {"chief": None, "worker": None}, (
        codes, self.tasks.log("chief")[-2000:],
        self.tasks.log("worker")[-2000:])
    for check in [c for c in self.due if c[0] <= time.monotonic()]:
      self.due.remove(check)
      step = self.tasks.steps()
      assert step > check[1], (step, check)
      if check[2] > 1:
        self.due.append([check[0] + TIMEOUT_SECS, step, check[2] - 1])


def one_error(log):
  errors = error_lines(log)
  assert len(errors) == 1, log[-3000:]
  return errors[0]


def test_strays_of_every_kind_are_refused_and_the_job_trains_on(tmp_path):
  chief, worker, stray = [f"127.0.0.1:{port}"
                          for port in launch.free_ports(3)]
  job = {"chief": [chief], "worker": [worker]}
  tasks = Tasks(tmp_path)
  strays = [  # (name, its cluster, its task, its token, its flags)
      ("stray_worker", {"chief": [chief], "worker": [stray]}, "worker", "b"),
      ("same_token", {"chief": [chief], "worker": [stray]}, "worker", "a",
       "--learning_rate=0.5"),
      ("stray_chief", {"chief": [stray], "worker": [worker]}, "chief", "c")]
  try:
    tasks.start("chief", job, "chief", "a", job="job", nice=10)
    tasks.start("worker", job, "worker", "a", job="job", nice=10)
    wait_until(lambda: tasks.steps() >= 20, 240, "the job's first steps")
    growth = Growth(tasks)
    for name, cluster, task_type, token, *flags in strays:
      process = tasks.start(name, cluster, task_type, token, *flags)
      growth.wait(process)
      assert process.returncode == 1, tasks.log(name)[-3000:]
      growth.stray_ended()
    growth.wait()
  finally:
    tasks.stop()
  assert (f"The chief at {chief} belongs to another job" in
          one_error(tasks.log("stray_worker")))
  same = one_error(tasks.log("same_token"))
  assert f"worker:0 at {worker} already trains in the job" in same, same
  assert "that job trains on" in same, same
  never = one_error(tasks.log("stray_chief"))
  assert f"task worker:0 ({worker}) has not joined" in never, never
  assert "TF_CONFIG" in never and "unset TF_CONFIG" in never, never
  assert not os.path.exists(tmp_path / "stray_chief" / "train.lock")
  healthy = tasks.log("chief")
  assert f"A task of another job (worker:0 at {stray}" in healthy
  assert f"A second worker:0 (worker:0 at {stray}) " in healthy
  assert not error_lines(healthy) and not error_lines(tasks.log("worker"))
  assert "dropped this task's session" not in tasks.log("worker")


def test_a_tf_config_left_in_the_shell_is_named_and_no_lock_stays(tmp_path):
  """train.py --max_steps=20 with a TF_CONFIG naming this process the chief
  of a job whose worker never starts: it ends within the peer timeout,
  naming TF_CONFIG from its first line to its last, and says to unset it."""
  chief, worker = [f"127.0.0.1:{port}" for port in launch.free_ports(2)]
  tf_config = json.dumps({"cluster": {"chief": [chief], "worker": [worker]},
                          "task": {"type": "chief", "index": 0}})
  model_dir = tmp_path / "model"
  ended = subprocess.run(
      [sys.executable, os.path.join(ROOT, "train.py"), "--model_name=mlp",
       "--max_steps=20", f"--model_dir={model_dir}",
       f"--peer_timeout_secs={TIMEOUT_SECS}"], cwd=ROOT,
      env={**ENV, "TF_CONFIG": tf_config}, capture_output=True, text=True,
      timeout=120)
  assert ended.returncode == 1, ended.stderr[-3000:]
  lines = [line for line in ended.stderr.splitlines() if _ABSL_LINE.match(line)]
  assert "TF_CONFIG" in lines[0], lines[:3]
  last = one_error(ended.stderr)
  assert last == lines[-1], lines[-3:]
  assert f"task worker:0 ({worker})" in last, last
  assert "TF_CONFIG" in last and "unset TF_CONFIG" in last, last
  assert os.listdir(model_dir) and not os.path.exists(model_dir / "train.lock")
