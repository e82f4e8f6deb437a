"""Runs the systems side by side: one subprocess each, interleaved windows.

For one model, every system's worker is started and builds its graph; then
each is warmed up in turn; then, round after round, each runs one timed
window of the same number of steps while the others wait. The order rotates
every round, so slow drifts of a noisy machine (other load, frequency
scaling) touch every system alike, and ratios are taken within one run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Optional

from absl import logging

from bench import protocol

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Job:
  """One system at one tower count on one model."""
  system: str
  towers: int
  model: str
  kind: str = "cpu"
  intra_op: int = 0  # session thread pools; 0 = TensorFlow's default.
  inter_op: int = 0
  replica: int = 0  # which of the job's identical processes this is.

  @property
  def label(self) -> str:
    name = "single" if self.system == "single" else (
        f"{self.system} x{self.towers}")
    if self.intra_op or self.inter_op:
      name += f" intra={self.intra_op} inter={self.inter_op}"
    return name


@dataclasses.dataclass
class Timing:
  """What one worker measured."""
  job: Job
  setup_seconds: float = 0.0
  window_seconds: list = dataclasses.field(default_factory=list)
  window_cpu_seconds: list = dataclasses.field(default_factory=list)
  steps_per_window: int = 0
  max_rss_mb: float = 0.0
  graph_digest: str = ""  # the training graph's ops, names and devices.
  num_ops: int = 0


def by_job(timings: list) -> dict:
  """The timings of each job's replicas, keyed by the job (replica 0)."""
  groups = {}
  for timing in timings:
    groups.setdefault(dataclasses.replace(timing.job, replica=0),
                      []).append(timing)
  return groups


def pool_replicas(timings: list) -> list:
  """One `Timing` per job, with the windows of all its replicas together."""
  return [dataclasses.replace(
      group[0], job=job,
      window_seconds=[s for t in group for s in t.window_seconds],
      window_cpu_seconds=[s for t in group for s in t.window_cpu_seconds],
      max_rss_mb=max(t.max_rss_mb for t in group))
          for job, group in by_job(timings).items()]


class Worker:
  """A `bench.worker` subprocess driven through `bench.protocol`."""

  def __init__(self, job: Job, log_dir: str):
    self.job = job
    name = f"{job.model}-{job.label}-{job.replica}".replace(" ", "")
    self._log_path = os.path.join(log_dir, name.replace("=", "") + ".log")
    self._log = open(self._log_path, "w")  # pylint: disable=consider-using-with
    self._process = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-m", "bench.worker", json.dumps(
            dataclasses.asdict(job))], cwd=REPO_ROOT, text=True, bufsize=1,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)

  def expect(self, event: str) -> dict:
    """Reads stdout up to the next protocol message, which must be `event`."""
    for line in self._process.stdout:
      message = protocol.parse(line)
      if message is not None:
        if message["event"] != event:
          break
        return message
    raise RuntimeError(f"{self.job.label} on {self.job.model} did not send "
                       f"{event!r}; see its log {self._log_path}")

  def run(self, steps: int) -> tuple:
    """Runs `steps` steps now; returns their wall-clock and CPU seconds."""
    self._process.stdin.write(f"run {steps}\n")
    window = self.expect("window")
    return window["seconds"], window["cpu_seconds"]

  def stop(self) -> None:
    """Asks the worker to finish; `finish` collects its last message."""
    self._process.stdin.write("stop\n")

  def finish(self) -> dict:
    """The `done` message; the worker is then killed, not waited for."""
    done = self.expect("done")
    self.kill()
    return done

  def kill(self) -> None:
    if self._process.poll() is None:
      self._process.kill()
      self._process.wait()
    self._log.close()


def steps_per_window(first: Worker, window_seconds: float) -> int:
  """Steps that take about `window_seconds` on the first system."""
  step = first.run(3)[0] / 3
  return max(2, round(window_seconds / step))


def measure_model(jobs: list, rounds: int, window_seconds: float,
                  log_dir: str) -> tuple:
  """Times every job of one model (the first is the baseline).

  Returns:
    The `Timing`s of the jobs that ran, in job order, and one error message
    per job whose worker failed before its first step (the others go on).
  """
  workers, timings, failures = [Worker(job, log_dir) for job in jobs], [], []
  logging.info("%s: started %d system processes; each builds its graph",
               jobs[0].model, len(jobs))
  try:
    for number, worker in enumerate(list(workers), start=1):
      try:
        ready = worker.expect("ready")
        timings.append(Timing(worker.job, ready["setup_seconds"],
                              graph_digest=ready.get("graph_digest", ""),
                              num_ops=ready.get("num_ops", 0)))
        logging.info("%s: %s ready (%d/%d, set up in %.0f s)", jobs[0].model,
                     _name(worker.job), number, len(jobs),
                     ready["setup_seconds"])
      except RuntimeError as error:
        if worker is workers[0]:
          raise
        logging.warning("%s: %s failed (%d/%d): %s", jobs[0].model,
                        _name(worker.job), number, len(jobs), error)
        failures.append(str(error))
        workers.remove(worker)
    _run_windows(workers, timings, rounds, window_seconds)
    return timings, failures
  finally:
    for worker in workers:
      worker.kill()


def _run_windows(workers: list, timings: list, rounds: int,
                 window_seconds: float) -> None:
  """Warm-up, then interleaved timed windows, then the peak RSS."""
  model, start = workers[0].job.model, time.perf_counter()
  steps = steps_per_window(workers[0], window_seconds)
  logging.info("%s: warming up %d systems (%d steps per window)", model,
               len(workers), steps)
  for worker in workers:
    worker.run(max(3, steps // 2))  # warm-up, discarded.
  for number, index in enumerate(_interleaved(len(workers), rounds), start=1):
    wall, cpu = workers[index].run(steps)
    timings[index].window_seconds.append(wall)
    timings[index].window_cpu_seconds.append(cpu)
    if number % len(workers) == 0:
      logging.info("%s: round %d/%d of timed windows done (%.0f s)", model,
                   number // len(workers), rounds,
                   time.perf_counter() - start)
  for worker in workers:  # all shut down at once.
    worker.stop()
  for worker, timing in zip(workers, timings):
    timing.steps_per_window = steps
    timing.max_rss_mb = worker.finish()["max_rss_mb"]


def _name(job: Job) -> str:
  """The job's label, with its replica when it has several processes."""
  return job.label + (f" (process {job.replica + 1})" if job.replica else "")


def _interleaved(count: int, rounds: int) -> list:
  """Job indices, round by round, each round's order rotated by one."""
  return [(start + offset) % count for start in range(rounds)
          for offset in range(count)]


def measure_graph_build(model: str, towers: list, repeats: int,
                        log_dir: str) -> dict:
  """Graph-construction seconds per tower count, with and without TF2 tensor
  equality: two single-threaded builder subprocesses side by side."""
  logging.info("%s: timing graph construction at %s towers", model,
               ", ".join(str(k) for k in towers))
  runs = {name: _start_graph_build(model, towers, equality, repeats, log_dir)
          for name, equality in (("with_equality", True),
                                 ("without_equality", False))}
  results = {name: _graph_result(*run) for name, run in runs.items()}
  logging.info("%s: graph construction timed", model)
  return results


def _start_graph_build(model: str, towers: list, equality: bool,
                       repeats: int, log_dir: str) -> tuple:
  job = json.dumps({"model": model, "towers": towers,
                    "tensor_equality": equality, "repeats": repeats})
  log = open(os.path.join(log_dir, f"graph-{model}-{equality}.log"), "w")  # pylint: disable=consider-using-with
  return subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, "-m", "bench.graphbuild", job], cwd=REPO_ROOT,
      text=True, stdout=subprocess.PIPE, stderr=log), log


def _graph_result(process: subprocess.Popen, log) -> Optional[dict]:
  out, _ = process.communicate()
  log.close()
  messages = [protocol.parse(line) for line in out.splitlines()]
  return next((m for m in messages if m is not None), None)
