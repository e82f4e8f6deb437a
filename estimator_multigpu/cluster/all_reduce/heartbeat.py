"""A peer that stops making progress ends the job, by its heartbeat.

A TCP probe (`peer_probe.PeerWatch`) finds a peer whose process is gone, but a
stopped process (SIGSTOP, a frozen VM) still accepts connections, and a
step stuck in one task leaves every other task waiting in the all-reduce.
`JobWatch`, a thread beside training, posts this task's heartbeat on the
job's board (`board`) every `interval_secs` — a counter, the steps this
process ran, and its phase — and reads everyone's:

- a peer whose counter has not moved for `timeout_secs` (as this task's
  clock sees it) is stopped or hung: its threads no longer run;
- a peer with no heartbeat at all twice `timeout_secs` after this watch
  began never joined: it was not started, or its address holds a task of
  another job (whose heartbeats go to another board);
- the chief's board not answering for `timeout_secs` is the chief gone;
- every task inside a step (phase "step") with no step finished anywhere
  for the allowance, `max(timeout_secs, 10 x the slowest step so far)`
  (3 x timeout_secs for the first step, which may compile), is
  a stuck step (a hung input or op in one task; the others wait for it in
  the all-reduce). A task building its graph ("starting"), saving a
  checkpoint, evaluating or running hooks between steps ("idle") is never
  stuck: only a heartbeat that stops counts then;
- a peer that posted why it ended (`end/<task>`: a signal, a disagreement)
  ends this task with the same line.

Each ends the task with one ERROR line naming the task as it was started,
status 1 (`on_end`).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from absl import logging
import tensorflow as tf

tf1 = tf.compat.v1

STARTING, STEP, IDLE = "starting", "step", "idle"
_STEP_ALLOWANCE = 10  # x the slowest step so far.
_FIRST_STEP_ALLOWANCE = 3  # x timeout_secs: no step to measure yet.


class Progress:
  """This task's phase and steps, set by `ProgressHook` (thread-safe
  enough: single writes of small values)."""

  def __init__(self):
    self.phase, self.steps, self.slowest = STARTING, 0, 0.0
    self._started = None

  def step_begins(self) -> None:
    self.phase, self._started = STEP, time.monotonic()

  def step_ends(self) -> None:
    self.slowest = max(self.slowest, time.monotonic() - self._started)
    self.phase, self.steps = IDLE, self.steps + 1


class ProgressHook(tf1.train.SessionRunHook):
  """Marks each training step in `progress` (pass it first)."""

  def __init__(self, progress: Progress):
    self._progress = progress

  def before_run(self, run_context):
    self._progress.step_begins()

  def after_run(self, run_context, run_values):
    self._progress.step_ends()


class JobWatch:
  """Heartbeats and progress of every task (a context manager).

  Args:
    board: the job's board (`board.Board`).
    me: this task ("chief:0"); `names`: {task: how it was started} of every
      task, this one included.
    progress: this task's `Progress`.
    timeout_secs: how long a peer may not beat, and a step may not end.
    interval_secs: seconds between beats.
    on_end: called with the one line (default: log it, exit with status 1).
    addresses: {task: its address}, for the lines.
    hint: what ends the line of a peer that never joined (where this
      task's cluster came from, `cluster.source`).
    stamp: what every beat carries besides (the posting process's `run`
      and `as`: `strays.live_twin` tells a live task by it).
  """

  def __init__(self, board, me: str, names: dict, progress: Progress,
               timeout_secs: float, interval_secs: float = 1.0,
               on_end: Optional[Callable[[str], None]] = None,
               addresses: Optional[dict] = None, hint: str = "",
               stamp: Optional[dict] = None):
    self._board, self._me, self._names = board, me, dict(names)
    self._addresses, self._hint = dict(addresses or {}), hint
    self._stamp = dict(stamp or {})
    self._progress, self._timeout = progress, timeout_secs
    self._interval = min(interval_secs, timeout_secs / 4)
    self._on_end = on_end or end_task
    self._stop = threading.Event()
    self._seen: dict = {}  # task -> (beat counter, when it last moved).
    self._steps = (-1, time.monotonic())  # (fewest steps, when it moved).
    self._answered = self._began = time.monotonic()

  def __enter__(self) -> "JobWatch":
    self._answered = self._began = time.monotonic()
    threading.Thread(target=self._watch, daemon=True,
                     name="job-watch").start()
    return self

  def __exit__(self, *exc_info) -> None:
    self._stop.set()

  def _watch(self) -> None:
    beat = 0
    while not self._stop.wait(self._interval):
      beat += 1
      line = self._check(beat)
      if line and not self._stop.is_set():
        self._on_end(line)
        return

  def _check(self, beat: int) -> Optional[str]:
    """The line that ends the job, or None: all is well."""
    try:
      self._board.post(f"beat/{self._me}", {
          "beat": beat, "steps": self._progress.steps,
          "phase": self._progress.phase, "slowest": self._progress.slowest,
          **self._stamp})
      entries = self._board.read()
    except tf.errors.OpError:
      return self._board_silent()
    self._answered = time.monotonic()
    return (self._ended(entries) or self._silent_peer(entries) or
            self._stuck(entries))

  def _board_silent(self) -> Optional[str]:
    """The chief hosts the board: for another task its silence is the
    chief's; on the chief itself it follows a peer's death (its session
    breaks), so the chief waits twice as long, for the peer probes that
    name the peer, and then names no one."""
    silent = time.monotonic() - self._answered
    if self._me == "chief:0":
      if silent <= 2 * self._timeout:
        return None
      return (f"this task's own job board has not answered for "
              f"{silent:.0f} s (a peer stopped or is unreachable); this task "
              f"({self.name(self._me)}) ends. Restart every task of the "
              "job: training resumes from the chief's newest checkpoint.")
    if silent <= self._timeout:
      return None
    return (f"task {self._names.get('chief:0', 'chief:0')} has not answered "
            f"for {silent:.0f} s (stopped, hung or unreachable); this task "
            f"({self.name(self._me)}) ends. Restart every task of the job: "
            "training resumes from the chief's newest checkpoint.")

  def _ended(self, entries: dict) -> Optional[str]:
    for key, entry in sorted(entries.items()):
      if key.startswith("end/") and key != f"end/{self._me}":
        return entry["line"]
    return None

  def _silent_peer(self, entries: dict) -> Optional[str]:
    now = time.monotonic()
    for task in self._names:
      beat = entries.get(f"beat/{task}", {}).get("beat")
      if beat is None and task != self._me:
        line = self._never_joined(task, now)
        if line:
          return line
        continue
      counter, moved = self._seen.get(task, (None, now))
      if beat != counter:
        self._seen[task] = (beat, now)
      elif now - moved > self._timeout and task != self._me:
        return (f"task {self.name(task)} has made no progress for "
                f"{now - moved:.0f} s (stopped, hung, or never started: "
                "its heartbeat does not move); this task "
                f"({self.name(self._me)}) ends. Restart every task of the "
                "job: training resumes from the chief's newest checkpoint.")
    return None

  def _never_joined(self, task: str, now: float) -> Optional[str]:
    """The line for a peer with no heartbeat twice the timeout after this
    watch began (a slow start gets the first), or None."""
    waited = now - self._began
    if waited <= 2 * self._timeout:
      return None
    address = self._addresses.get(task)
    named = f"{self.name(task)} ({address})" if address else self.name(task)
    return (f"task {named} has not joined this job: no heartbeat of it in "
            f"{waited:.0f} s (it was not started, or the process at its "
            "address is a task of another job: check the addresses and the "
            "EMG_JOB_TOKEN given to each task); this task "
            f"({self.name(self._me)}) ends. {self._hint}").strip()

  def _stuck(self, entries: dict) -> Optional[str]:
    beats = [entries.get(f"beat/{task}") for task in self._names]
    if any(b is None or b["phase"] != STEP for b in beats):
      self._steps = (-1, time.monotonic())
      return None
    fewest = min(b["steps"] for b in beats)
    if fewest != self._steps[0]:
      self._steps = (fewest, time.monotonic())
      return None
    waited = time.monotonic() - self._steps[1]
    slowest = max(b["slowest"] for b in beats)
    allowance = (max(self._timeout, _STEP_ALLOWANCE * slowest) if slowest
                 else _FIRST_STEP_ALLOWANCE * self._timeout)
    if waited <= allowance:
      return None
    return (f"no task has finished a step for {waited:.0f} s (allowance "
            f"{allowance:.0f} s): every task is inside step {fewest + 1} of "
            f"this run ({', '.join(self.name(t) for t in self._names)}); "
            "one is stuck (a hung input or op) and the others wait for it "
            "in the all-reduce; the job stops. Restart every task: training "
            "resumes from the chief's newest checkpoint.")

  def name(self, task: str) -> str:
    return self._names.get(task, task)


_ENDING = threading.Lock()


def claim_end() -> bool:
  """Whether this caller is the first to end the process (one line only);
  any later caller should wait for the exit (`wait_for_exit`)."""
  return _ENDING.acquire(blocking=False)


def wait_for_exit() -> None:
  """Blocks this thread: another one is ending the process."""
  threading.Event().wait()


def end_task(line: str, status: int = 1) -> None:
  """Logs `line` as the task's last, then ends the process at once (a
  process holding a gRPC server can hang in TensorFlow's teardown)."""
  if not claim_end():
    wait_for_exit()
  log_and_exit(line, status)


def log_and_exit(line: str, status: int) -> None:
  from estimator_multigpu.cluster.task import exit_process  # pylint: disable=g-import-not-at-top
  logging.error("%s", line)
  exit_process(status)
