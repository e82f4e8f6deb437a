"""What one training step executes, per task: `bench.cluster --trace_step=N`.

Evidence that does not depend on the machine's load: the chief of each job
runs step N with `RunOptions(trace_level=FULL_TRACE)` and records, from the
step's `RunMetadata`, how many ops each device executed, by op type. Two
systems' steps then compare op by op (`difference`): what one system's step
does that the other's does not. The op durations of that one step are
recorded too (their sum per op type), but they do depend on the load.
"""

from __future__ import annotations

import collections
import time
from typing import Optional

import tensorflow as tf

tf1 = tf.compat.v1
_NAMES_KEPT = 8  # node names kept per op type, to find where ops come from.


def summarize_step_stats(step_stats) -> dict:
  """{op type: {"count": executions, "micros": summed op time, "names":
  the first few node names}} of a step.

  Args:
    step_stats: a `StepStats` proto (`RunMetadata.step_stats`), or the
      same structure as dicts (`dev_stats` → `node_stats` with
      `timeline_label` "name = Type(...)" or `node_name`).
  """
  counts: dict = collections.defaultdict(
      lambda: {"count": 0, "micros": 0, "names": []})
  for device in step_stats.dev_stats:
    if "stream:" in device.device or "memcpy" in device.device:
      continue  # GPU trace streams repeat the device's ops.
    for node in device.node_stats:
      kind = op_type(node.timeline_label, node.node_name)
      counts[kind]["count"] += 1
      counts[kind]["micros"] += node.all_end_rel_micros
      if len(counts[kind]["names"]) < _NAMES_KEPT:
        counts[kind]["names"].append(node.node_name)
  return dict(counts)


def op_type(timeline_label: str, node_name: str) -> str:
  """The op type in a node's timeline label ("x = MatMul(a, b)" → MatMul);
  `_SOURCE`-style names when the label has none."""
  _, _, call = timeline_label.partition(" = ")
  kind = call.split("(", 1)[0].strip()
  return kind or node_name


def difference(ours: dict, theirs: dict) -> list:
  """[(op type, our count, their count)] where the counts differ, by the
  size of the difference, largest first."""
  kinds = set(ours) | set(theirs)
  rows = [(k, ours.get(k, {}).get("count", 0),
           theirs.get(k, {}).get("count", 0)) for k in kinds]
  rows = [row for row in rows if row[1] != row[2]]
  return sorted(rows, key=lambda row: (-abs(row[1] - row[2]), row[0]))


def total_ops(summary: dict) -> int:
  return sum(entry["count"] for entry in summary.values())


class StepTrace(tf1.train.SessionRunHook):
  """Traces the step run when the global step is `step` (once).

  Attributes:
    summary: `summarize_step_stats` of that step, once it ran (else None).
    timeline: {"before_run", "after_run": seconds since the epoch, "nodes":
      `timeline` of the step}, once it ran (else None).
  """

  def __init__(self, step: int):
    self._step, self._runs, self._before = step, 0, 0.0
    self.summary: Optional[dict] = None
    self.timeline: Optional[dict] = None

  def before_run(self, run_context):
    self._runs += 1
    if self._runs != self._step:
      return None
    self._before = time.time()
    return tf1.train.SessionRunArgs(
        None, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE))

  def after_run(self, run_context, run_values):
    if self._runs == self._step and run_values.run_metadata is not None:
      stats = run_values.run_metadata.step_stats
      self.summary = summarize_step_stats(stats)
      self.timeline = {"before_run": self._before, "after_run": time.time(),
                       "nodes": timeline(stats)}


def timeline(step_stats) -> list:
  """[(start µs since the epoch, duration µs, op type, node name)] of every
  op of a step that took time, by start (the tasks of a job share one
  machine's clock, so their timelines line up)."""
  nodes = [(node.all_start_micros, node.all_end_rel_micros,
            op_type(node.timeline_label, node.node_name), node.node_name)
           for device in step_stats.dev_stats
           if "stream:" not in device.device
           for node in device.node_stats if node.all_end_rel_micros > 0]
  return sorted(nodes)


def comparison(runs: list, ours: str = "allreduce") -> str:
  """Markdown: per (model, tasks, towers), the op types whose counts in the
  traced step differ between ours and each other system (first traced run
  of each), and every system's total."""
  traced = {}
  for run in runs:
    key = (run["model"], run["tasks"], run["towers"], run["system"])
    if run.get("trace") and key not in traced:
      traced[key] = run["trace"]
  lines = []
  for (model, tasks, towers, system), trace in traced.items():
    mine = traced.get((model, tasks, towers, ours))
    if system == ours or mine is None:
      continue
    lines += [f"\n{model} {tasks} × {towers}: ops in one step, {ours} "
              f"{total_ops(mine)} / {system} {total_ops(trace)}",
              f"| op type | {ours} | {system} |", "|---|---|---|"]
    lines += [f"| {kind} | {a} | {b} |"
              for kind, a, b in difference(mine, trace)]
  return "\n".join(lines)
