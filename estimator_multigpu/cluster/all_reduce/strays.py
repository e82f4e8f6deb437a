"""A stray task refuses itself before it joins a job, in one line.

Two kinds of stray reach a running job's chief, and `guard` asks about both
before the task posts anything (a stray's writes would reach the job's
tasks):

- a task of another job (another `EMG_JOB_TOKEN`) whose cluster names this
  chief: the chief's entries are not signed with its token
  (`board_entries.Foreign`);
- a second task of a live task's name (this job's token, its own cluster:
  a worker started again with another address, other settings): that
  name's heartbeat is another process's (another `run`) and it moves.

Either ends with one line that says the job it reached trains on, after a
note on the board (`Board.notify`, constants only) by which the chief
names it in a WARNING. A task whose name holds only a heartbeat that does
not move (its own run before a restart) joins as usual.
"""

from __future__ import annotations

import time
from typing import Optional

import tensorflow as tf

from estimator_multigpu.cluster.all_reduce import board as board_lib
from estimator_multigpu.cluster.all_reduce import board_entries

TWIN_WAIT_SECS = 4.0  # > two beats of a live task (at most 1 s apart).
_POLL_SECS = 0.5
_CHECK = ("Check the addresses (--worker_hosts / TF_CONFIG) and the job "
          "token given to each task.")


def foreign_chief(board: board_lib.Board, chief: str
                  ) -> Optional[board_entries.Foreign]:
  """The entry of another job's task `chief` ("chief:0") seen so far."""
  found = sorted((f for f in board.foreign if f.task == chief), key=str)
  return found[0] if found else None


def foreign_line(stray: board_entries.Foreign, chief_address: str,
                 me: str) -> str:
  """The line of task `me` (as started) whose chief is another job's."""
  return (f"The chief at {chief_address} belongs to another job "
          f"({stray.name}; its board entries are not signed with this "
          f"task's EMG_JOB_TOKEN): this task ({me}) is not part of that "
          f"job and ends before joining it; that job trains on. {_CHECK}")


def live_twin(board: board_lib.Board, me: str, run: str,
              wait_secs: float = TWIN_WAIT_SECS) -> Optional[dict]:
  """The heartbeat of a live task of this job named `me` ("worker:0")
  that another process (not `run`) posts, or None.

  Raises:
    tf.errors.OpError: the chief's server did not answer in time.
  """
  first = _beat(board, me)
  if not first or first.get("run") in (None, run):
    return None
  deadline = time.monotonic() + wait_secs
  while time.monotonic() < deadline:
    time.sleep(_POLL_SECS)
    beat = _beat(board, me)
    if beat and beat.get("run") == first["run"] and (
        beat.get("beat") != first.get("beat")):
      return beat
  return None


def _beat(board: board_lib.Board, task: str) -> Optional[dict]:
  return board.get(f"beat/{task}")


def twin_line(live: dict, chief_address: str, me: str, task: str) -> str:
  """The line of task `me` (as started and where; `task`: "worker:0")
  whose name a live task of the job holds."""
  return (f"{live.get('as', task)} already trains in the job of the chief "
          f"at {chief_address}: this task ({me}) is a second {task} and "
          f"ends before joining it; that job trains on. {_CHECK}")


def twin_note(live: dict, me: str, task: str) -> tuple:
  """(name, entry) of the note by which the chief names a second task
  (`me`: as started, `task`: "worker:0")."""
  return f"{board_lib.TWIN_PREFIX}{task}", {"as": me,
                                            "live": live.get("as", "?")}


def leave_note(board: board_lib.Board, name: str, entry: dict) -> None:
  """Posts a stray's note for the chief's log (if the chief answers)."""
  try:
    board.notify(name, entry)
  except tf.errors.OpError:
    pass
