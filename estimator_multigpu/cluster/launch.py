"""Starts a whole cluster on this machine, to try distributed training.

    python -m estimator_multigpu.cluster.launch --num_ps 1 --num_workers 2 -- \\
        --model_name=mlp --max_steps=300 --model_dir=runs/cluster

With `--num_ps 0` it starts an all-reduce job (a chief and workers; pass
`--variable_update=replicated` to the script).

Every task runs `python <script> <flags after -->` plus its cluster flags
(`--ps_hosts`, `--worker_hosts`, `--job_name`, `--task_index`; worker 0 is
the chief), or with `--tf_config` the same cluster in a TF_CONFIG environment
variable. Addresses are free loopback ports (TensorFlow's servers still
listen on every interface: one WARNING line, `exposure_line`, says they
are reachable from the network and how to close them), and every task gets
the same job token (`EMG_JOB_TOKEN`), so a task of another job is refused by
name, and `EMG_LAUNCHED` (its lines name the launcher as where its cluster
came from, `cluster.source`). Each task writes
`<log_dir>/<job>_<index>.log`. The launcher waits for the job, stops every
process it started that is still running, prints one line per task, each
evaluator's final metrics line (`accuracy=... global_step=...`, the last
`key=value` line of its log) and the log directory, and exits with the
job's status: 0 when every task ended by itself with status 0;
otherwise the chief's status if it failed, else the first failed task's
(124 when `--timeout_secs` ran out, 1 when a ps had to be stopped).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

from absl import logging

from estimator_multigpu import cluster
from estimator_multigpu.cluster import source

TOKEN_VARIABLE = "EMG_JOB_TOKEN"  # cluster.all_reduce.guard's job token.
_OWN_FLAGS = ("--ps_hosts", "--worker_hosts", "--job_name", "--task_index")
# evaluation.format_metrics' line: key=value pairs, one of them global_step.
_METRICS_LINE = re.compile(r"^(\S+=\S+ )*global_step=\S+( \S+=\S+)*$")


@dataclasses.dataclass
class TaskProcess:
  """One started task: its name (`ps_0`, `worker_0`, `evaluator_0`)."""
  name: str
  job: str
  log_path: str
  process: subprocess.Popen
  stopped: bool = False  # by the launcher, not by itself.

  @property
  def returncode(self) -> Optional[int]:
    return self.process.poll()


def free_ports(count: int) -> list:
  """`count` distinct loopback ports that nothing listens on right now."""
  sockets = []
  try:
    for _ in range(count):
      sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      sock.bind(("localhost", 0))
      sockets.append(sock)
    return [sock.getsockname()[1] for sock in sockets]
  finally:
    for sock in sockets:
      sock.close()


def exposure_line(ports: list) -> str:
  """The one line saying the ports are reachable from the network, and how
  to close them."""
  listed = ",".join(str(port) for port in ports)
  return (f"Ports {listed} are reachable from the network: TensorFlow's "
          "servers listen on 0.0.0.0 (every interface, whatever the cluster "
          "names) without authentication and run any graph sent to them. To "
          "close them: sudo iptables -I INPUT -p tcp -m multiport --dports "
          f"{listed} ! -i lo -j DROP, or run the job in a container without "
          "a network (docker run --network none); docs/clusters.md: Who can reach the "
          "job.")


def task_flags(ps_hosts: list, worker_hosts: list, job: str, index: int,
               use_tf_config: bool) -> tuple:
  """The command-line flags and extra environment of one task."""
  if use_tf_config:
    task = cluster.task_from_flags(ps_hosts, worker_hosts, job, index)
    return [], {"TF_CONFIG": task.tf_config()}
  return [f"--ps_hosts={','.join(ps_hosts)}",
          f"--worker_hosts={','.join(worker_hosts)}", f"--job_name={job}",
          f"--task_index={index}"], {}


def start_task(command: list, env: dict, name: str, job: str,
               log_dir: str) -> TaskProcess:
  """Starts one task in its own process group, output to its log file."""
  log_path = os.path.join(log_dir, f"{name}.log")
  with open(log_path, "w") as log:
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, **env},
                               start_new_session=True)
  logging.info("Started %s (pid %d), log %s", name, process.pid, log_path)
  return TaskProcess(name, job, log_path, process)


def start_cluster(tasks: list, script: str, script_args: list, num_ps: int,
                  num_workers: int, evaluator: bool, log_dir: str,
                  use_tf_config: bool) -> None:
  """Starts the ps tasks, the workers (0: chief) and the evaluator.

  Each started task is appended to `tasks` at once, so a failure half-way
  still leaves the caller every process to stop.
  """
  ports = free_ports(num_ps + num_workers)
  hosts = [f"localhost:{port}" for port in ports]
  logging.warning("%s", exposure_line(ports))
  marks = {TOKEN_VARIABLE: secrets.token_hex(8),  # tells this job apart.
           source.LAUNCHER_VARIABLE: "1"}  # the tasks' lines name it.
  ps_hosts, worker_hosts = hosts[:num_ps], hosts[num_ps:]
  jobs = ([(cluster.PS, i) for i in range(num_ps)] +
          [(cluster.WORKER, i) for i in range(num_workers)])
  if evaluator:
    jobs.append((cluster.EVALUATOR, 0))
  for job, index in jobs:
    flags, env = task_flags(ps_hosts, worker_hosts, job, index, use_tf_config)
    command = [sys.executable, script, *script_args, *flags]
    tasks.append(start_task(command, {**env, **marks}, f"{job}_{index}", job,
                            log_dir))


def first_failure(tasks: list) -> Optional[TaskProcess]:
  """The chief if it failed, else the first task that exited non-zero."""
  failed = [t for t in tasks if t.returncode not in (None, 0)]
  chief = [t for t in failed if t.name == f"{cluster.WORKER}_0"]
  return (chief or failed or [None])[0]


def wait_for_job(tasks: list, timeout_secs: float, grace_secs: float) -> int:
  """Waits for the workers and evaluator, then `grace_secs` for the ps."""
  deadline = time.monotonic() + timeout_secs
  finishers = [t for t in tasks if t.job != cluster.PS]
  while True:
    failed = first_failure(tasks)
    if failed is not None:
      logging.error("%s failed with status %d; see %s", failed.name,
                    failed.returncode, failed.log_path)
      return failed.returncode
    if all(t.returncode is not None for t in finishers):
      break
    if time.monotonic() > deadline:
      logging.error("The job did not finish within %g s; stopping it.",
                    timeout_secs)
      return 124
    time.sleep(0.2)
  return wait_for_ps(tasks, min(grace_secs,
                                max(deadline - time.monotonic(), 0.0)))


def wait_for_ps(tasks: list, grace_secs: float) -> int:
  """The ps tasks should exit by themselves once the job is finished."""
  deadline = time.monotonic() + grace_secs
  while (any(t.returncode is None for t in tasks) and
         time.monotonic() < deadline):
    time.sleep(0.2)
  failed = first_failure(tasks)
  if failed is not None:
    return failed.returncode
  running = [t.name for t in tasks if t.returncode is None]
  if running:
    logging.error("%s still running %g s after the job finished; stopping "
                  "it.", ", ".join(running), grace_secs)
    return 1
  return 0


def stop_all(tasks: list, grace_secs: float = 10.0) -> None:
  """SIGTERM to every task still running, SIGKILL after `grace_secs`."""
  for sig, wait in ((signal.SIGTERM, grace_secs), (signal.SIGKILL, 10.0)):
    running = [t for t in tasks if t.returncode is None]
    for task in running:
      task.stopped = True
      with_group(task, sig)
    deadline = time.monotonic() + wait
    while any(t.returncode is None for t in running) and (
        time.monotonic() < deadline):
      time.sleep(0.1)


def with_group(task: TaskProcess, sig: int) -> None:
  """Sends `sig` to the task's process group (the task and its children)."""
  try:
    os.killpg(task.process.pid, sig)
  except ProcessLookupError:
    pass


def final_metrics(log_path: str) -> Optional[str]:
  """The last metrics line (`accuracy=... global_step=...`) of a log."""
  try:
    with open(log_path, errors="replace") as log:
      lines = [line.strip() for line in log]
  except OSError:
    return None
  return next((line for line in reversed(lines)
               if _METRICS_LINE.match(line)), None)


def summary(tasks: list, log_dir: Optional[str] = None) -> str:
  """One line per task, each evaluator's final metrics, the log dir."""
  lines = []
  for task in tasks:
    how = ("stopped by the launcher" if task.stopped else
           f"exit status {task.returncode}")
    role = " (chief)" if task.name == f"{cluster.WORKER}_0" else ""
    lines.append(f"{task.name}{role}: {how}; log {task.log_path}")
  for task in tasks:
    if task.job == cluster.EVALUATOR:
      metrics = final_metrics(task.log_path)
      lines.append(f"{task.name} final metrics: "
                   f"{metrics or 'none (see its log)'}")
  if log_dir:
    lines.append(f"logs in {log_dir}")
  return "\n".join(lines)


def parse_args(argv: Sequence[str]) -> tuple:
  """The launcher's arguments, and the script's (everything after `--`)."""
  argv = list(argv)
  split = argv.index("--") if "--" in argv else len(argv)
  own, script_args = argv[:split], argv[split + 1:]
  parser = argparse.ArgumentParser(
      prog="python -m estimator_multigpu.cluster.launch",
      description="Start ps tasks, workers and optionally an evaluator on "
      "this machine; arguments after -- go to every task.")
  parser.add_argument("--num_ps", type=int, default=1)
  parser.add_argument("--num_workers", type=int, default=2,
                      help="workers, including the chief (worker 0)")
  parser.add_argument("--evaluator", action="store_true",
                      help="also start an evaluator task")
  parser.add_argument("--script", default="train.py",
                      help="the training script every task runs")
  parser.add_argument("--log_dir", default=None,
                      help="one log per task (default: a new temp dir)")
  parser.add_argument("--tf_config", action="store_true",
                      help="describe the cluster in TF_CONFIG, not flags")
  parser.add_argument("--timeout_secs", type=float, default=3600)
  parser.add_argument("--grace_secs", type=float, default=90,
                      help="time the ps tasks get to exit after the job")
  args = parser.parse_args(own)
  check_args(parser, args, script_args)
  return args, script_args


def check_args(parser, args, script_args: list) -> None:
  if args.num_ps < 0 or args.num_workers < 1 or (
      args.num_ps == 0 and args.num_workers < 2):
    parser.error(f"--num_ps={args.num_ps} and --num_workers="
                 f"{args.num_workers}; each must be at least 1 (or --num_ps "
                 "0 with at least 2 workers: an all-reduce job, whose tasks "
                 "replicate the variables by default).")
  if not os.path.isfile(args.script):
    parser.error(f"--script={args.script} does not exist (relative to "
                 f"{os.getcwd()}); run from the repository root or give "
                 "its path.")
  given = [a for a in script_args if a.split("=")[0] in _OWN_FLAGS]
  if given:
    parser.error(f"{' '.join(given)}: the launcher sets the cluster flags "
                 "itself; remove them from the arguments after --.")


def main(argv: Optional[Sequence[str]] = None) -> int:
  logging.set_verbosity(logging.INFO)
  args, script_args = parse_args(sys.argv[1:] if argv is None else argv)
  log_dir = args.log_dir or tempfile.mkdtemp(prefix="cluster_logs_")
  os.makedirs(log_dir, exist_ok=True)
  previous = signal.signal(signal.SIGTERM, _raise_interrupt)
  tasks = []
  try:
    start_cluster(tasks, args.script, script_args, args.num_ps,
                  args.num_workers, args.evaluator, log_dir, args.tf_config)
    status = wait_for_job(tasks, args.timeout_secs, args.grace_secs)
  except KeyboardInterrupt:
    status = 130
  finally:
    stop_all(tasks)
    signal.signal(signal.SIGTERM, previous)
  print(summary(tasks, log_dir), flush=True)
  print(f"job status {status}", flush=True)
  return status


def _raise_interrupt(signum, frame):
  del signum, frame
  raise KeyboardInterrupt


if __name__ == "__main__":
  sys.exit(main())
