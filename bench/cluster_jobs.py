"""The jobs of a `bench.cluster` run, and the processes of one job: start
them, wait, stop them.

`jobs` lists the run's jobs, the systems in alternating order round after
round. Every process starts in its own session. A job ends by itself or at its
timeout; then every process left, and every process it started (horovodrun
starts its workers in sessions of their own), is killed by PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from estimator_multigpu.cluster import launch

from bench import cluster_horovod
from bench import cluster_report


def runnable(systems: list) -> list:
  """The systems this Python can run (Horovod is optional: one line)."""
  if cluster_horovod.SYSTEM in systems and not cluster_horovod.available():
    print(cluster_horovod.skip_line(), flush=True)
    return [s for s in systems if s != cluster_horovod.SYSTEM]
  return list(systems)


def jobs(config: dict) -> list:
  """Every job, round after round, the systems in alternating order."""
  systems, found = runnable(config["systems"]), []
  for round_index in range(config["rounds"]):
    order = systems if round_index % 2 == 0 else systems[::-1]
    for model in config["models"]:
      for tasks, towers in config["configs"]:
        found += [{"system": system, "model": model, "tasks": tasks,
                   "towers": towers, "steps": config["steps"],
                   "trace_step": config["trace_step"],
                   "round": round_index + 1}
                  for system in order
                  if system != "mwms" or towers == 1]
  return found


def task_commands(system: str, tasks: int) -> list:
  """[(name, extra flags, extra environment)] of every process of a job
  (for Horovod, the one `horovodrun` that starts the rest)."""
  if system == cluster_horovod.SYSTEM:
    return [("horovodrun", [], {})]
  ports = [f"localhost:{p}" for p in launch.free_ports(tasks + 1)]
  if system == "ps":
    hosts = [f"--ps_hosts={ports[0]}", f"--worker_hosts={','.join(ports[1:])}"]
    return [(f"{job}{i}", hosts + [f"--job_name={job}", f"--task_index={i}"],
             {}) for job, i in [("ps", 0)] + [("worker", i)
                                             for i in range(tasks)]]
  spec = {"chief": ports[:1], "worker": ports[1:tasks]}
  names = [("chief", 0)] + [("worker", i) for i in range(tasks - 1)]
  return [(f"{job}{i}", [], {"TF_CONFIG": json.dumps(
      {"cluster": spec, "task": {"type": job, "index": i}})})
          for job, i in names]


def task_command(job: dict, name: str, work_dir: str, flags_: list) -> list:
  """The command line of process `name` of `job` ({system, model, tasks,
  towers, steps, trace_step})."""
  record = "chief0" if job["system"] == cluster_horovod.SYSTEM else name
  command = [sys.executable, "-m", "bench.cluster_task",
             f"--system={job['system']}", f"--model={job['model']}",
             f"--towers={job['towers']}", f"--steps={job['steps']}",
             f"--model_dir={os.path.join(work_dir, name)}",
             f"--out={os.path.join(work_dir, record + '.json')}",
             f"--trace_step={job['trace_step']}", *flags_]
  if job["system"] == cluster_horovod.SYSTEM:
    return cluster_horovod.launch_command(job["tasks"], job["towers"],
                                          command)
  return command


def start_job(job: dict, work_dir: str, started: list) -> None:
  """Starts the job's processes, each in its own session, appending
  (name, Popen) to `started` at once (so a failure half-way leaves the
  caller every process to stop)."""
  for name, flags_, env in task_commands(job["system"], job["tasks"]):
    with open(os.path.join(work_dir, name + ".log"), "w") as log:
      started.append((name, subprocess.Popen(
          task_command(job, name, work_dir, flags_),
          cwd=cluster_report.REPO_ROOT, env={**os.environ, **env},
          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)))


def wait_and_stop(processes: list, timeout_secs: float) -> dict:
  """Waits for the trainers (not the ps), then kills what is left by PID."""
  deadline = time.monotonic() + timeout_secs
  for name, process in processes:
    if not name.startswith("ps"):
      try:
        process.wait(timeout=max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        break
  codes = {name: process.poll() for name, process in processes}
  for _, process in processes:
    for pid in descendants(process.pid):
      _kill(pid)
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)  # its own session: pgid = pid.
      process.wait()
  return codes


def descendants(pid: int) -> list:
  """The PIDs of every living process below `pid` (from /proc)."""
  children: dict = {}
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      parent = _parent(int(entry))
      if parent is not None:
        children.setdefault(parent, []).append(int(entry))
  found, todo = [], [pid]
  while todo:
    for child in children.get(todo.pop(), []):
      found.append(child)
      todo.append(child)
  return found


def _parent(pid: int):
  """The parent PID of `pid`, or None if it is gone."""
  try:
    with open(f"/proc/{pid}/stat") as stat:
      # "pid (command) state ppid ...": the command may hold spaces.
      return int(stat.read().rsplit(")", 1)[1].split()[1])
  except (OSError, IndexError, ValueError):
    return None


def _kill(pid: int) -> None:
  try:
    os.kill(pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
