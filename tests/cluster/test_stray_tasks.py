"""A job's tasks against absent, late, duplicate and foreign tasks.

Real train.py processes on loopback (`TrainTasks`): every wait is bounded
(`wait(timeout=...)`) and every process is killed in a `finally`; no test
asserts on time.
"""

import json
import os
import subprocess
import sys

import pytest
from test_all_reduce_faults import error_lines
from test_all_reduce_faults import TrainTasks
from test_distributed import ENV
from test_distributed import last_step_logged
from test_distributed import ROOT
from test_distributed import wait_until

pytestmark = pytest.mark.slow


def test_a_chief_alone_then_its_late_worker_each_end_naming_the_other(
    tmp_path):
  """The chief gives up on a worker that never came; the worker, started
  once the chief is gone (a late restart, or a typo in --worker_hosts),
  ends too instead of waiting forever in the board's first call."""
  tasks = TrainTasks(tmp_path, f"--model_dir={tmp_path / 'model'}",
                     "--max_steps=20", "--peer_timeout_secs=5")
  try:
    assert tasks.start(0).wait(timeout=120) == 1, tasks.log("chief")[-3000:]
    assert tasks.start(1).wait(timeout=120) == 1, (
        tasks.log("worker1")[-3000:])
  finally:
    tasks.stop()
  chief, worker = error_lines(tasks.log("chief")), error_lines(
      tasks.log("worker1"))
  assert len(chief) == 1 and "task worker --task_index=1" in chief[0], chief
  assert len(worker) == 1, worker
  assert "task worker --task_index=0 (the chief)" in worker[0], worker
  assert tasks.hosts.split(",")[0] in worker[0], worker


def test_a_second_launch_and_a_stray_worker_are_refused_and_the_job_trains_on(
    tmp_path):
  """A healthy job (token "a"). Launched twice (same ports, same model
  dir): the duplicate chief is refused naming the live chief's PID (its
  lock stays), and so is a plain run on that model dir (one writer). A
  worker of another job (token "b") naming this chief's address: refused
  before it joins anything, named on both sides."""
  model_dir = tmp_path / "model"
  tasks = TrainTasks(tmp_path, f"--model_dir={model_dir}",
                     "--max_steps=100000", "--save_checkpoints_steps=100000")
  others = [TrainTasks(tmp_path / name, f"--model_dir={model_dir}",
                       "--max_steps=100000") for name in ("again", "stray")]
  try:
    chief = tasks.start(0, token="a")
    tasks.start(1, token="a")
    wait_until(lambda: last_step_logged(tasks.log("chief")) >= 3, 180,
               "the chief's 3rd step")
    again, stray = others
    again.hosts = tasks.hosts
    stray.hosts = f"{tasks.hosts.split(',')[0]},{stray.hosts.split(',')[1]}"
    for other in others:
      other.dir.mkdir()
    started = [again.start(0, token="c"), stray.start(1, token="b")]
    plain = subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), "--model_name=mlp",
         f"--model_dir={model_dir}", "--max_steps=1"], cwd=ROOT, env=ENV,
        capture_output=True, text=True, timeout=120)
    codes = [p.wait(timeout=120) for p in started]
    assert codes[0] != 0 and codes[1] == 1, codes
    step = last_step_logged(tasks.log("chief"))
    wait_until(lambda: last_step_logged(tasks.log("chief")) > step + 2, 120,
               "more steps of the live job")
    assert json.load(open(model_dir / "train.lock"))["pid"] == chief.pid
  finally:
    for each in [tasks, *others]:
      each.stop()
  for output in (again.log("chief"), plain.stderr):
    assert f"PID {chief.pid} on host" in output, output[-2000:]
  assert plain.returncode != 0
  assert "Taking over" not in again.log("chief")
  refused = error_lines(stray.log("worker1"))
  assert len(refused) == 1, stray.log("worker1")[-3000:]
  assert f"The chief at {tasks.hosts.split(',')[0]} belongs to another job" in (
      refused[0])
  assert "A task of another job (worker --task_index=1 at " in (
      tasks.log("chief"))
  assert not error_lines(tasks.log("chief"))
