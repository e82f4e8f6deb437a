"""The line protocol between the coordinator and one benchmark subprocess.

The coordinator writes commands on the worker's stdin, one per line:
`run N` (run N training steps now, then report how long they took) or
`stop`. The worker answers on stdout with lines `BENCH {json}`: `ready` once
its graph and session exist and one step ran, `window` after each run, `done`
(with the peak RSS) on `stop`, after which the coordinator kills it. Only
one worker runs steps at a time, so timed windows of different systems never
compete for the cores; idle workers block on stdin. A window reports its
wall-clock seconds and the CPU seconds of all the worker's threads.
"""

from __future__ import annotations

import hashlib
import json
import resource
import sys
import time
from typing import Optional

import tensorflow as tf

tf1 = tf.compat.v1
PREFIX = "BENCH "


def send(event: str, **fields) -> None:
  """Writes one `BENCH {json}` line to stdout."""
  sys.stdout.write(PREFIX + json.dumps({"event": event, **fields}) + "\n")
  sys.stdout.flush()


def parse(line: str) -> Optional[dict]:
  """The message of a `BENCH` line, or None for any other output."""
  return json.loads(line[len(PREFIX):]) if line.startswith(PREFIX) else None


def next_command() -> int:
  """Blocks for the next command: steps to run, 0 for `stop`."""
  line = sys.stdin.readline().split()
  if not line or line[0] != "run":
    return 0
  return int(line[1])


def max_rss_mb() -> float:
  """Peak resident set size of this process (ru_maxrss is KiB on Linux)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class Pacer:
  """Counts steps of the current command and reports finished windows.

  The first step runs before `ready` is sent: it holds one-off costs
  (graph optimisation, memory allocation), which so count as set-up and are
  paid while the workers start side by side, not in the timed rounds.
  """

  def __init__(self, started: float):
    self._started = started
    self._remaining = 1
    self._window_start = self._cpu_start = 0.0
    self._is_ready = False
    self.graph: Optional[tf.Graph] = None  # the training graph, once built.

  def _next(self) -> bool:
    self._remaining = next_command()
    if self._remaining <= 0:
      # Answered before the framework's teardown (Estimator's and
      # MirroredStrategy's take up to ~40 s), which the coordinator skips.
      send("done", max_rss_mb=max_rss_mb())
      return False
    self._window_start = time.perf_counter()
    self._cpu_start = time.process_time()
    return self._remaining > 0

  def step_done(self) -> bool:
    """Call after each step; returns False when told to stop."""
    self._remaining -= 1
    if self._remaining > 0:
      return True
    if self._is_ready:
      send("window", seconds=time.perf_counter() - self._window_start,
           cpu_seconds=time.process_time() - self._cpu_start)
    else:
      self._is_ready = True
      send("ready", setup_seconds=time.perf_counter() - self._started,
           tf_version=tf.__version__, **graph_fingerprint(self.graph))
    return self._next()


def graph_fingerprint(graph: Optional[tf.Graph]) -> dict:
  """Op count and digest of what one training step runs.

  The step is the train op (`TRAIN_OP` collection) and every op it depends
  on, through inputs and control inputs; each op counts by name, type and
  inputs. Requested devices are left out: at one tower they are the only
  difference between the unwrapped graph and `multi_gpu`'s, and the placer
  puts both on the same device. (Savers and initializers, which group
  variables by requested device, are not part of the step.)
  """
  train_ops = graph.get_collection(tf1.GraphKeys.TRAIN_OP) if graph else []
  if not train_ops:
    return {}
  seen = {}
  stack = [op if isinstance(op, tf.Operation) else op.op for op in train_ops]
  while stack:
    op = stack.pop()
    if op.name not in seen:
      seen[op.name] = op
      stack += [t.op for t in op.inputs] + list(op.control_inputs)
  ops = sorted((op.name, op.type, tuple(t.name for t in op.inputs))
               for op in seen.values())
  digest = hashlib.sha1(repr(ops).encode()).hexdigest()[:12]
  return {"num_ops": len(ops), "graph_digest": digest}


class PacedHook(tf1.train.SessionRunHook):
  """Drives `Estimator.train` by the coordinator's commands."""

  def __init__(self, pacer: Pacer):
    self._pacer = pacer

  def begin(self):
    self._pacer.graph = tf1.get_default_graph()

  def after_run(self, run_context, run_values):
    del run_values
    if not self._pacer.step_done():
      run_context.request_stop()
