"""What keeps an all-reduce task from hanging or training wrongly.

`JobGuard` wraps one task's training (`all_reduce_training.run_task`):

- the job's board on the chief's server (`board`) and the heartbeat watch
  (`heartbeat.JobWatch`): a stopped or stuck peer ends every task;
- before it posts anything, a stray refuses itself (`strays`: a task of
  another job whose cluster names this chief, a second task of a live
  task's name);
- before anything is built, a first exchange (`agreement`) of the job's
  identity (the cluster lists; the job token keys the board) and the
  caller's settings,
  plus the chief's newest checkpoint step: a task of another job or with
  other settings is refused by name, and when the chief is already at
  `max_steps` every task says so in one line and returns;
- in the training graph's `begin` (built, no session yet, no collective
  run), a second exchange of what the graph holds (`graph` round);
- a stop signal to any task: the job stops at one agreed step and the
  chief saves it (`stop_signal`); a task whose step does not finish within
  the grace time leaves without a final checkpoint, saying which stands
  (`abandon`).
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from typing import Callable, Optional

from absl import logging
import tensorflow as tf

from estimator_multigpu.cluster.all_reduce import agreement
from estimator_multigpu.cluster.all_reduce import board as board_lib
from estimator_multigpu.cluster.all_reduce import heartbeat
from estimator_multigpu.cluster.all_reduce import stop_signal
from estimator_multigpu.cluster.all_reduce import strays

tf1 = tf.compat.v1

TOKEN_VARIABLE = "EMG_JOB_TOKEN"
_LINGER_SECS = 10.0  # an ending chief keeps the board up for late readers.
_END_LINGER_SECS = 2.5  # > 2 beats: every peer reads why the chief ended.


class JobGuard:
  """One all-reduce task's guard (a context manager around training).

  Args:
    cluster: the task's `cross_tower.across_tasks.AllReduceCluster`.
    target: this task's server target (the chief's board is reached at
      the chief's own address: `board.Board`).
    model_dir: the Estimator's model dir.
    timeout_secs: `peer_timeout_secs`.
    names: {task ("worker:0"): how it was started}; default the task name.
    settings: {setting: value} every task must share (JSON values).
    setting_names: {setting: how the user sets it (a flag)}.
    received: this task's stop signal, if any (`SignalStop`); None: the
      caller handles no signal, so no stop is agreed (no per-step call).
    hint: what ends the line of a task whose peer never came (where the
      cluster came from, `cluster.source`).
  """

  def __init__(self, cluster, target: str, model_dir: str,
               timeout_secs: float, names: Optional[dict] = None,
               settings: Optional[dict] = None,
               setting_names: Optional[dict] = None,
               received: Optional[Callable[[], Optional[int]]] = None,
               hint: str = ""):
    self.tasks = [_task_name(device) for device in cluster.tasks]
    self.me = self.tasks[cluster.position]
    self.names = {task: (names or {}).get(task, task) for task in self.tasks}
    self._cluster, self._model_dir = cluster, model_dir
    self._timeout, self._settings = timeout_secs, dict(settings or {})
    self._setting_names, self._hint = setting_names, hint
    self._outsider = False  # refused: posts nothing on the job's board.
    self.run = secrets.token_hex(4)  # this process, in its heartbeats.
    self.board = board_lib.Board(
        target if cluster.is_chief else
        f"grpc://{self._cluster_address(self.tasks[0])}",
        cluster.tasks[cluster.position], cluster.leader,
        token=os.environ.get(TOKEN_VARIABLE, "(none)"), me=self.me,
        started=f"{self.name()} at {self._cluster_address(self.me)}")
    self.progress = heartbeat.Progress()
    self.stop = stop_signal.JobStop(self.board, self.me, cluster.is_chief,
                                 self.name, received or (lambda: None))
    self._agrees_stops = received is not None
    self._watch = heartbeat.JobWatch(
        self.board, self.me, self.names, self.progress, timeout_secs,
        on_end=self._watch_end, hint=hint, stamp={
            "run": self.run, "as": self.board.started},
        addresses={task: self._cluster_address(task) for task in self.tasks})

  def __enter__(self) -> "JobGuard":
    return self  # the heartbeats start in `greet`.

  def __exit__(self, *exc_info) -> None:
    self._watch.__exit__(*exc_info)

  @property
  def wait_secs(self) -> float:
    """How long an exchange waits for peers still starting (building a
    large graph takes minutes); a dead one ends the job sooner."""
    return max(10 * self._timeout, 600.0)

  def identity(self) -> dict:
    """What tells this job apart beyond its token (whose entries a task of
    another job never reads: `board_entries`): the cluster lists."""
    return {"cluster": self._cluster.cluster}

  def greet(self, max_steps: Optional[int]) -> bool:
    """The first exchange; False when the chief has nothing left to train
    (every task then logs one line and should return).

    Ends the task (status 1, one line) when a task disagrees.
    """
    self._reach_chief()
    self._read_round("hello")  # a chief of another job: refused first.
    self._refuse_if_twin()
    self._watch.__enter__()
    mine = {"identity": self.identity(), "settings": self._settings}
    posted = self._exchange("hello", mine)
    step = posted[self.tasks[0]].get("chief step")
    if max_steps is None or step is None or step < max_steps:
      return True
    logging.warning(
        "The chief's model dir %s is already at step %d, at or past "
        "--max_steps=%d: nothing to train (%s). Give a larger --max_steps "
        "to train on.", self._model_dir, step, max_steps, self.name())
    if self._cluster.is_chief:
      self._linger("hello")
    return False

  def _reach_chief(self) -> None:
    """Waits at most the peer timeout for the chief's server (the board's
    first call); else ends the task with one line naming the chief."""
    try:
      self.board.connect(self._timeout)
    except tf.errors.OpError:
      chief = self.tasks[0]
      self.end(f"task {self.name(chief)} ({self._cluster_address(chief)}) "
               f"has not answered within --peer_timeout_secs="
               f"{self._timeout:g} s: it is not running (never started, or "
               "it gave up) or its address is wrong; this task "
               f"({self.name()}) ends. Start every task of the job with the "
               "same cluster: training resumes from the chief's newest "
               f"checkpoint. {self._hint}".strip())

  def _cluster_address(self, task: str) -> str:
    job, index = task.split(":")
    return self._cluster.cluster[job][int(index)]

  def hooks(self) -> list:
    """The hooks to run first in the task's `Estimator.train`."""
    stops = ([stop_signal.StopHook(self.stop, lambda: self.progress.steps)]
             if self._agrees_stops else [])
    return [heartbeat.ProgressHook(self.progress), *stops, _GraphCheck(self)]

  def check_graph(self, graph: tf.Graph) -> None:
    """The second exchange: what the training graph holds."""
    self._exchange("graph", {"graph": agreement.graph_description(graph)})

  def _exchange(self, round_name: str, mine: dict) -> dict:
    if self._cluster.is_chief and round_name == "hello":
      mine["chief step"] = stop_signal.checkpoint_step(self._model_dir)
    try:
      return agreement.exchange(
          lambda entry: self.board.post(f"{round_name}/{self.me}", entry),
          lambda: self._read_round(round_name), self.me,
          self.tasks, mine, self.wait_secs, self.names, self._setting_names)
    except agreement.DisagreementError as error:
      self.end(str(error), linger=round_name)
    except (TimeoutError, tf.errors.OpError) as error:
      self._refuse_if_foreign()
      hint = f" {self._hint}" if isinstance(error, TimeoutError) else ""
      self.end(f"{self.name()}: {_message(error)}{hint}")
    raise AssertionError("unreachable")  # `end` exits.

  def _read_round(self, round_name: str) -> dict:
    """{task: entry} of a round (after `_refuse_if_foreign`)."""
    posted = _by_task(self.board.read(f"{round_name}/"))
    if self.tasks[0] not in posted:
      self._refuse_if_foreign()
    return posted

  def _refuse_if_foreign(self) -> None:
    """A worker whose chief's address holds a chief of another job (its
    entries under another token) ends, saying so, before it posts
    anything (a stray's writes reach the other job's tasks)."""
    chief = self.tasks[0]
    stray = strays.foreign_chief(self.board, chief)
    if stray and not self._cluster.is_chief:
      self._refuse((f"refused/{self.me}", {}), strays.foreign_line(
          stray, self._cluster_address(chief), self.name()))

  def _refuse_if_twin(self) -> None:
    """A task whose name a live task of this job holds (another process
    beats under it) ends, saying so, before it posts anything."""
    live = strays.live_twin(self.board, self.me, self.run)
    if live:
      self._refuse(strays.twin_note(live, self.board.started, self.me),
                   strays.twin_line(live, self._cluster_address(
                       self.tasks[0]), self.board.started, self.me))

  def _refuse(self, note: tuple, line: str) -> None:
    self._outsider = True
    strays.leave_note(self.board, *note)  # the chief names this task.
    self.end(line)

  def name(self, task: Optional[str] = None) -> str:
    return self.names[task or self.me]

  def end(self, line: str, status: int = 1,
          linger: Optional[str] = None) -> None:
    """Posts why this task ends, logs the line, exits with `status` (the
    first caller only: another thread's end waits for the exit)."""
    if not heartbeat.claim_end():
      heartbeat.wait_for_exit()
    try:
      if self.board.connected and not self._outsider:  # else the
        # chief never answered, or this task is refused.
        self.board.post(f"end/{self.me}", {"line": line})
    except tf.errors.OpError:
      pass  # the chief is gone: the peers find that out themselves.
    if linger and self._cluster.is_chief:
      self._linger(linger)
    elif self._cluster.is_chief:  # the peers' next read finds the line.
      time.sleep(_END_LINGER_SECS)
    heartbeat.log_and_exit(line, status)

  def peer_gone(self, line: str) -> None:
    """`peer_probe.PeerWatch`'s end: a peer that posted why it ended is named
    by its own line, else by `line`. During an agreed stop a peer that
    left is no fault."""
    if self.stop.stopping:
      return
    try:
      ended = [entry["line"] for key, entry in
               sorted(self.board.read("end/").items())
               if key != f"end/{self.me}"] if self.board.connected else []
    except tf.errors.OpError:
      ended = []
    self.end(ended[0] if ended else line)

  def failed(self, error: Exception) -> None:
    """This task's training raised (a checkpoint it could not write, ...):
    posts why, so every peer ends with the real cause in its line; the
    caller then reports the error itself."""
    line = (f"task {self.name()} failed: {type(error).__name__}: "
            f"{_message(error)}; the job stops (fix that, then restart every "
            "task: training resumes from the chief's newest checkpoint).")
    try:
      self.board.post(f"end/{self.me}", {"line": line})
    except tf.errors.OpError:
      return
    if self._cluster.is_chief:  # the peers' next read finds the line.
      time.sleep(_END_LINGER_SECS)

  def _watch_end(self, line: str) -> None:
    """`JobWatch`'s end, except during an agreed stop (peers leave then)."""
    if not self.stop.stopping:
      self.end(line)

  def finish_stop(self, wait_secs: float) -> Optional[int]:
    """After training returned: on an agreed stop, logs this task's one
    line (the step the chief saved) and returns the signal; else None."""
    if not self.stop.stopping:
      return None
    logging.warning("%s", self.stop.finish(self._model_dir, wait_secs))
    try:
      self.board.post(f"stopped/{self.me}", {})
    except tf.errors.OpError:
      return self.stop.signal()
    if self._cluster.is_chief:
      self._linger("stopped")
    return self.stop.signal()

  def watch_stop(self, grace_secs: float) -> None:
    """Ends the task `grace_secs` after a stop signal (its own or the
    agreed stop's), should it still be running then (a step, a final save
    or a teardown that hangs): whatever its state, a stopped task exits
    within the grace."""
    def watch():
      while self.stop.signal() is None:
        time.sleep(agreement.POLL_SECS)
      time.sleep(grace_secs)
      self.abandon(self.stop.signal(), grace_secs)
    threading.Thread(target=watch, daemon=True, name="stop-grace").start()

  def abandon(self, signal_number: int, waited_secs: float) -> None:
    """A stop signal whose step did not finish in time: leave without a
    final checkpoint (the newest one stands)."""
    line = (f"{self.name()}: {stop_signal.signal_name(signal_number)} arrived "
            f"{waited_secs:.0f} s ago, but this task has not stopped: its "
            "step (or final save) has not finished (an all-reduce step waits "
            "for every task: is one stopped or gone?). Exiting without a "
            "final checkpoint; the newest checkpoint in the model dir "
            "stands.")
    self.end(line, 128 + signal_number)

  def _linger(self, round_name: str) -> None:
    """The chief keeps its board up until every task has read the round
    (it posted its own entry), at most `_LINGER_SECS`."""
    deadline = time.monotonic() + _LINGER_SECS
    while time.monotonic() < deadline:
      try:
        if len(self.board.read(f"{round_name}/")) >= len(self.tasks):
          time.sleep(2 * agreement.POLL_SECS)  # their last read.
          return
      except tf.errors.OpError:
        return
      time.sleep(agreement.POLL_SECS)


class _GraphCheck(tf1.train.SessionRunHook):
  """Compares the training graph across tasks in `begin` (before the
  session, whose initialization already runs collectives)."""

  def __init__(self, guard: JobGuard):
    self._guard = guard

  def begin(self):
    self._guard.check_graph(tf1.get_default_graph())


def _task_name(device: str) -> str:
  """"/job:worker/replica:0/task:1" -> "worker:1"."""
  spec = tf.DeviceSpec.from_string(device)
  return f"{spec.job}:{spec.task}"


def _by_task(entries: dict) -> dict:
  return {key.split("/", 1)[1]: entry for key, entry in entries.items()}


_NOISE = ("Graph execution error", "Detected at node", "File ", "Node:",
          "[[", "Original stack trace", "Additional GRPC", ":{", "{")


def _message(error: Exception) -> str:
  """The error in one line, without what TensorFlow adds (the node, its
  Python stack, gRPC's details)."""
  text = getattr(error, "message", None) or str(error)
  kept = [line.strip() for line in text.splitlines()
          if line.strip() and not line.strip().startswith(_NOISE)]
  return " ".join(kept) or type(error).__name__
