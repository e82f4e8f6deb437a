"""Tasks that disagree are refused before the first step, by name.

Every step of an all-reduce job sums every task's gradients; tasks that
build another net, another tower count or another optimizer would fail deep
in TensorFlow ("Shape mismatch in the collective instance") or, worse, train
on silently with diverging copies. So before the first step each task posts
a description of what it trains on the job's board (`board`, no collective
involved) and compares it with every other task's:

- `identity`: the cluster (TF_CONFIG's lists). A task of another job (another
  `EMG_JOB_TOKEN`) never gets this far: it cannot read this job's entries
  (`board_entries`) and is refused by name before any exchange
  (`guard`). A guard against mistakes, not authentication: anyone who
  reaches the port can run any graph.
- `settings`: what the caller says must match (train.py: its table of
  settings, `cli/model_dir/run_settings.py`).
- `graph`: what the package reads from the training graph: the variables'
  names and shapes, the optimizers' update ops with their constant
  hyperparameters, the towers per task.

A difference is one line naming the setting and both values, the same on
every task (each compares with all the others).
"""

from __future__ import annotations

import re
import time
from typing import Callable, Optional

import tensorflow as tf

tf1 = tf.compat.v1

_UPDATE_OP = re.compile(r"^(Resource)?(Sparse)?Apply[A-Z]")
_TOWER = re.compile(r"^tower_(\d+)/")
POLL_SECS = 0.5


class DisagreementError(ValueError):
  """Another task of the job trains with other settings (one line)."""


def graph_description(graph: tf.Graph) -> dict:
  """{setting: value} the package reads from a training graph."""
  described = {f"variable {v.op.name}": v.shape.as_list()
               for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)}
  described["optimizer updates"] = sorted({
      _update(op) for op in graph.get_operations()
      if _UPDATE_OP.match(op.type)})
  towers = {int(m.group(1)) for op in graph.get_operations()
            for m in [_TOWER.match(op.name)] if m}
  described["towers per task"] = max(towers, default=0) + 1
  return described


def _update(op: tf.Operation) -> str:
  """`ResourceApplyMomentum(lr=0.2, momentum=0.9)`: the op and its
  constant scalar inputs (hyperparameters; a schedule is a tensor)."""
  names = [arg.name for arg in op.op_def.input_arg]
  constants = []
  for name, tensor in zip(names, op.inputs):
    value = tf.get_static_value(tensor)
    if value is not None and getattr(value, "size", 1) == 1:
      constants.append(f"{name}={float(value):.6g}")
  return f"{op.type}({', '.join(constants)})"


def first_difference(mine: dict, theirs: dict) -> Optional[tuple]:
  """(setting, my value, their value) of the first setting (by name) that
  differs; "(none)" for a setting only one side has."""
  for name in sorted(set(mine) | set(theirs)):
    if mine.get(name, "(none)") != theirs.get(name, "(none)"):
      return name, mine.get(name, "(none)"), theirs.get(name, "(none)")
  return None


def disagreement(mine: dict, theirs: dict, me: str, them: str,
                 flags: Optional[dict] = None) -> Optional[str]:
  """The one line saying how task `them` disagrees with this one, or None.

  `mine` and `theirs` are descriptions ({"identity": {...}, "settings":
  {...}, "graph": {...}}); `me` and `them` name the tasks; `flags` maps a
  setting to how the user sets it.
  """
  for part in ("identity", "settings", "graph"):
    found = first_difference(mine.get(part, {}), theirs.get(part, {}))
    if found:
      return _line(part, *found, me, them, (flags or {}).get(found[0]))
  return None


def _line(part: str, setting: str, here, there, me: str, them: str,
          how: Optional[str]) -> str:
  values = f"{here!r} on {me}, {there!r} on {them}"
  if setting == "cluster":
    return (f"The TF_CONFIG cluster lists differ: {values}. Give every task "
            "the same cluster (only `task` differs); the job stops.")
  fix = f"give every task the same {how or setting}"
  return (f"Tasks disagree on {how or setting} ({part}): {values}. Every "
          f"task of an all-reduce job must train the same model the same "
          f"way: {fix}; the job stops.")


def exchange(post: Callable[[dict], None], read: Callable[[], dict],
             me: str, tasks: list, mine: dict, wait_secs: float,
             names: Optional[dict] = None, flags: Optional[dict] = None
             ) -> dict:
  """Posts `mine`, compares it with every other task's as they arrive.

  Args:
    post: writes this task's description.
    read: {task: description} of those posted so far (this one included).
    me: this task's name; `tasks`: every task's name.
    mine: this task's description.
    wait_secs: how long to wait for the others (the job's liveness watch
      ends it sooner when a peer is gone).
    names: task -> how it was started, for the messages.
    flags: setting -> how the user sets it, for the messages.

  Returns:
    {task: description} of every task.

  Raises:
    DisagreementError: a task posted another description.
    TimeoutError: some tasks did not post within `wait_secs`.
  """
  post(mine)
  deadline = time.monotonic() + wait_secs
  while True:
    posted = read()
    for them, theirs in sorted(posted.items()):
      name = (names or {}).get
      line = disagreement(mine, theirs, name(me, me), name(them, them), flags)
      if them != me and line:
        raise DisagreementError(line)
    missing = [task for task in tasks if task not in posted]
    if not missing:
      return posted
    if time.monotonic() > deadline:
      missing = [(names or {}).get(task, task) for task in missing]
      raise TimeoutError(
          f"{', '.join(missing)} did not describe its settings within "
          f"{wait_secs:g} s of this task; start every task of the "
          "job (same cluster) or raise the wait.")
    time.sleep(POLL_SECS)
