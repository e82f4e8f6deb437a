"""Watchdogs of a trainer: its ps tasks and its chief, while it trains.

- `PsWatchdog`: a trainer whose ps stops answering mid-job exits with a
  clear error after `ps_wait_secs` instead of waiting forever.
- `ChiefWatch`: a worker stops when the chief has stopped (the job ended),
  and pauses while the chief is gone (killed, being restarted): without the
  chief nothing it trains would be saved.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from absl import logging
import tensorflow as tf

from estimator_multigpu.cluster.ps.control_queues import chief_answers
from estimator_multigpu.cluster.ps.control_queues import job_ended
from estimator_multigpu.cluster.ps.control_queues import ps_answers
from estimator_multigpu.cluster.task import CHIEF
from estimator_multigpu.cluster.task import exit_process
from estimator_multigpu.cluster.task import Task

tf1 = tf.compat.v1


class PsWatchdog:
  """Ends a trainer whose ps tasks stop answering while it trains.

  When a ps dies mid-job, MonitoredSession recreates its session and waits
  for the ps with no time limit. This daemon thread probes every ps task each
  `probe_secs`; once one has not answered for `patience_secs`, it calls
  `on_lost(index, silent_secs)`, by default: log why, exit with status 1.
  Use it as a context manager around training.
  """

  def __init__(self, task: Task, patience_secs: float,
               probe_secs: float = 2.0,
               on_lost: Optional[Callable[[int, float], None]] = None):
    self._task, self._patience, self._probe = task, patience_secs, probe_secs
    self._on_lost = on_lost or self._exit
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._watch, daemon=True,
                                    name="ps_watchdog")

  def __enter__(self) -> "PsWatchdog":
    self._thread.start()
    return self

  def __exit__(self, *exc_info) -> None:
    self._stop.set()  # a probe under way finishes on its own (daemon).

  def _watch(self) -> None:
    last_answer = [time.monotonic()] * len(self._task.ps_hosts)
    while not self._stop.wait(self._probe):
      for index, answered_at in enumerate(last_answer):
        if ps_answers(self._task, index, self._probe):
          last_answer[index] = time.monotonic()
          continue
        silent = time.monotonic() - answered_at
        if silent >= self._patience and not self._stop.is_set():
          self._on_lost(index, silent)
          return

  def _exit(self, index: int, silent_secs: float) -> None:
    logging.error(
        "%s: ps task %d at %s has not answered for %.0f s while training; "
        "stopping (status 1) instead of waiting for it forever. The ps "
        "holds the variables: restart it, then this task; the chief "
        "restores the last checkpoint in model_dir.", self._task.device,
        index, self._task.ps_hosts[index], silent_secs)
    exit_process(1)


class ChiefWatch(tf1.train.SessionRunHook):
  """A worker's view of its chief: stop when the job ended, wait while gone.

  A daemon thread probes every `probe_secs` whether the chief has stopped
  (`job_ended`) and whether its server answers. The hook then:
  - requests a stop once the chief has stopped: the job ended;
  - pauses before the next step once the chief has not answered for
    `patience_secs` (killed, or being restarted): only the chief saves, so
    steps without it would be lost when it restores the last checkpoint. It
    resumes when the chief answers again, and raises `RuntimeError` after
    `max_wait_secs` without it.
  """

  def __init__(self, task: Task, patience_secs: float = 10.0,
               max_wait_secs: float = 600.0, probe_secs: float = 2.0,
               stop_requested: Callable[[], bool] = lambda: False):
    self._task, self._patience = task, patience_secs
    self._max_wait, self._probe = max_wait_secs, probe_secs
    self._stop_requested = stop_requested
    self._ended = threading.Event()
    self._last_answer = time.monotonic()
    self._done = threading.Event()

  def begin(self):
    self._done.clear()
    threading.Thread(target=self._watch, daemon=True,
                     name="chief_watch").start()

  def end(self, session):
    self._done.set()

  def _watch(self) -> None:
    while not self._done.wait(self._probe):
      if job_ended(self._task):
        self._ended.set()
        return
      if chief_answers(self._task, self._probe):
        self._last_answer = time.monotonic()

  def _silent_secs(self) -> float:
    return time.monotonic() - self._last_answer

  def before_run(self, run_context):
    if self._silent_secs() < self._patience or self._ended.is_set():
      return
    chief = self._task.cluster[CHIEF][0]
    logging.warning(
        "%s: the chief at %s has not answered for %.0f s; pausing this "
        "worker until it is back (without the chief nothing trained here "
        "would be saved). Restart the chief with the same command; it "
        "restores the last checkpoint and this worker resumes.",
        self._task.device, chief, self._silent_secs())
    while self._silent_secs() >= self._patience and not (
        self._ended.is_set() or self._stop_requested()):
      if self._silent_secs() > self._max_wait:
        raise RuntimeError(
            f"{self._task.device}: the chief at {chief} has not answered for "
            f"{self._silent_secs():.0f} s; stopping this worker. Restart the "
            "chief (same command), then this worker.")
      time.sleep(0.5)
    if not (self._ended.is_set() or self._stop_requested()):
      logging.info("%s: the chief is back; resuming.", self._task.device)
    else:
      run_context.request_stop()

  def after_run(self, run_context, run_values):
    if self._ended.is_set():
      logging.info("%s: the chief has stopped, so the job has ended; "
                   "stopping this worker.", self._task.device)
      run_context.request_stop()
