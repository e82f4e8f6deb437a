"""A stop signal to any task stops the whole job at one step, saved.

Every step of an all-reduce job needs every task: a task that leaves its
loop after the current step leaves the others waiting in the next
all-reduce, and the chief, which alone saves, would end without a final
checkpoint. So a stop is agreed on the job's board (`board`):

1. a task that received SIGTERM / SIGINT posts `stop/<task>` and trains on;
2. the chief, after its step `n` (steps of this run, the same on every
   task: each step is one all-reduce), finds a request — its own signal
   or a peer's entry — and posts `stop at` = n + 1 (no task has finished
   step n + 1 yet: it needs the chief's part);
3. every task requests a stop after that step (workers read `stop at`
   after every step, one small board call), so all leave their loops
   together; the chief's Estimator writes the final checkpoint, and the
   chief posts `saved` with the step on disk;
4. every task ends with one line naming the signal, the task that got it
   and the step the chief saved (or the newest checkpoint that stands, if
   none was written): no line claims a checkpoint that was not written.

While the agreed stop runs, a peer that leaves is no fault (`stopping`);
the stop grace (`JobGuard.watch_stop`) still bounds every task.
"""

from __future__ import annotations

import signal
import time
from typing import Callable, Optional

import tensorflow as tf

tf1 = tf.compat.v1

STOP_AT, SAVED = "stop at", "saved"
_POLL_SECS = 0.5


class JobStop:
  """One task's part of an agreed stop.

  Args:
    board: the job's board.
    me: this task ("worker:0"); `is_chief`: whether it is the chief.
    name: task -> how it was started, for the lines.
    received: this task's own stop signal, if any (`SignalStop`).
  """

  def __init__(self, board, me: str, is_chief: bool,
               name: Callable[[str], str],
               received: Callable[[], Optional[int]]):
    self._board, self._me, self._is_chief = board, me, is_chief
    self._name, self._received = name, received
    self._asked = False
    self.agreed: Optional[dict] = None  # {"step", "signal", "task"}.
    self.global_step: Optional[int] = None  # after the last step.

  @property
  def stopping(self) -> bool:
    return self.agreed is not None

  def signal(self) -> Optional[int]:
    """The signal that stops this task: its own, or the agreed stop's."""
    own = self._received()
    return own if own is not None else (self.agreed or {}).get("signal")

  def after_step(self, steps: int) -> bool:
    """After this task's `steps`-th step of the run: whether it stops."""
    self._ask()
    if self.agreed is None:
      self.agreed = (self._decide(steps) if self._is_chief else
                     self._get(STOP_AT))
    return self.agreed is not None and steps >= self.agreed["step"]

  def _ask(self) -> None:
    own = self._received()
    if own is None or self._asked or self._is_chief:
      return
    self._asked = True
    self._post(f"stop/{self._me}", {"signal": own, "task": self._me})

  def _decide(self, steps: int) -> Optional[dict]:
    """The chief: the stop step once a task asked (its own signal first)."""
    own = self._received()
    if own is not None:
      request = {"signal": own, "task": self._me}
    else:
      try:
        asked = self._board.read("stop/")
      except tf.errors.OpError:
        return None
      request = next(iter(asked[k] for k in sorted(asked)), None)
    if request is None:
      return None
    agreed = {**request, "step": steps + 1}
    self._post(STOP_AT, agreed)
    return agreed

  def finish(self, model_dir: str, wait_secs: float) -> str:
    """After training returned on an agreed stop: the chief posts the step
    it saved; every task returns its one line."""
    if self._is_chief:
      saved = {"step": checkpoint_step(model_dir),
               "global step": self.global_step}
      self._post(SAVED, saved)
    else:
      saved = self._wait_for_saved(wait_secs)
    return self.line(saved, model_dir)

  def _wait_for_saved(self, wait_secs: float) -> dict:
    deadline = time.monotonic() + wait_secs
    while time.monotonic() < deadline:
      entry = self._get(SAVED)
      if entry is not None:
        return entry
      time.sleep(_POLL_SECS)
    return {}

  def line(self, saved: dict, model_dir: str) -> str:
    """The task's last line; `saved`: the chief's step on disk and its
    global step ({}: the chief did not say)."""
    agreed, step = self.agreed, saved.get("step")
    who = self._name(agreed["task"])
    if not saved:
      where = ("the chief did not confirm a final checkpoint; the newest "
               f"one in {model_dir} stands")
    elif step is None:
      where = f"no checkpoint was written in {model_dir}"
    elif step == saved.get("global step"):
      where = f"the chief saved checkpoint {step} in {model_dir}"
    else:
      where = (f"global step {saved.get('global step')} was not saved; the "
               f"newest checkpoint in {model_dir} is step {step}")
    return (f"The job stopped on {signal_name(agreed['signal'])} to task "
            f"{who} after step {agreed['step']} of this run; {where}. "
            f"This task ({self._name(self._me)}) ends; restart every task "
            "to resume.")

  def _get(self, name: str) -> Optional[dict]:
    try:
      return self._board.get(name)
    except tf.errors.OpError:
      return None

  def _post(self, name: str, entry: dict) -> None:
    try:
      self._board.post(name, entry)
    except tf.errors.OpError:
      pass  # the chief is gone: the stop grace ends this task.


class StopHook(tf1.train.SessionRunHook):
  """Requests a stop after the agreed step (pass it after the progress
  hook, which counts the step)."""

  def __init__(self, stop: JobStop, steps: Callable[[], int]):
    self._stop, self._steps = stop, steps

  def begin(self):
    self._global_step = tf1.train.get_global_step()

  def after_run(self, run_context, run_values):
    if self._stop.after_step(self._steps()):
      self._stop.global_step = int(run_context.session.run(
          self._global_step))
      run_context.request_stop()


def checkpoint_step(model_dir: str) -> Optional[int]:
  """The global step of the newest checkpoint in `model_dir`, or None."""
  checkpoint = tf.train.latest_checkpoint(model_dir)
  if checkpoint is None:
    return None
  return int(tf.train.load_variable(checkpoint, "global_step"))


def signal_name(number: int) -> str:
  try:
    return signal.Signals(number).name
  except ValueError:
    return f"signal {number}"
