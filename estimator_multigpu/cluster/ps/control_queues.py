"""The control plane of a cluster job: small shared queues and probes.

Messages between a job's tasks travel through tiny queues on the ps tasks
(`done_queue`, `ready_queue`, `ended_queue`), driven from side sessions
with timeouts (`control_session`, `run_with_timeout`), so no task ever waits
on another forever. `ps_answers` and `chief_answers` probe a task's server
with a trivial op.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import tensorflow as tf

from estimator_multigpu.cluster.task import CHIEF
from estimator_multigpu.cluster.task import PS
from estimator_multigpu.cluster.task import Task

tf1 = tf.compat.v1

_DONE_QUEUE = "estimator_multigpu_done"
_READY_QUEUE = "estimator_multigpu_chief_ready"
_ENDED_QUEUE = "estimator_multigpu_job_ended"  # closed when the chief stops.
CONTROL_TIMEOUT_SECS = 10


def done_queue() -> tf1.FIFOQueue:
  return tf1.FIFOQueue(1000, [tf.string], shapes=[[]], name="done_queue",
                       shared_name=_DONE_QUEUE)


def size_and_dequeue() -> tuple:
  """The done queue's size and a dequeue from it (poll, then take)."""
  queue = done_queue()
  return queue.size(), queue.dequeue()


def ready_queue() -> tf1.FIFOQueue:
  return tf1.FIFOQueue(1, [tf.int32], shapes=[[]], name="chief_ready_queue",
                       shared_name=_READY_QUEUE)


def ended_queue() -> tf1.FIFOQueue:
  """Never filled; the chief closes it when it stops: the job has ended."""
  return tf1.FIFOQueue(1, [tf.int32], shapes=[[]], name="job_ended_queue",
                       shared_name=_ENDED_QUEUE)


@contextlib.contextmanager
def control_session(target: str, device: str, build: Callable):
  """A session on `target` running the op `build()` places on `device`.

  Its calls time out after `CONTROL_TIMEOUT_SECS` unless a run says
  otherwise: closing a session on a ps that just exited would wait forever.
  """
  graph = tf.Graph()
  with graph.as_default(), tf.device(device):
    fetch = build()
  config = tf1.ConfigProto(device_filters=[device], operation_timeout_in_ms=(
      CONTROL_TIMEOUT_SECS * 1000))
  with tf1.Session(target, graph=graph, config=config) as session:
    yield session, fetch


def run_with_timeout(session: tf1.Session, fetch: Any, timeout_secs: float) -> Any:
  options = tf1.RunOptions(timeout_in_ms=max(int(timeout_secs * 1000), 1))
  return session.run(fetch, options=options)


def ps_endpoint(task: Task, index: int) -> tuple:
  return f"grpc://{task.ps_hosts[index]}", f"/job:{PS}/task:{index}"


def ps_answers(task: Task, index: int, timeout_secs: float) -> bool:
  """Whether ps task `index` runs a trivial op within `timeout_secs`."""
  target, device = ps_endpoint(task, index)
  try:
    with control_session(target, device, lambda: tf.constant(0)) as (
        session, probe):
      run_with_timeout(session, probe, timeout_secs)
    return True
  except tf.errors.OpError:
    return False


def chief_answers(task: Task, timeout_secs: float) -> bool:
  """Whether the chief's server runs a trivial op within `timeout_secs`."""
  target = f"grpc://{task.cluster[CHIEF][0]}"
  try:
    with control_session(target, f"/job:{CHIEF}/task:0",
                          lambda: tf.constant(0)) as (session, probe):
      run_with_timeout(session, probe, timeout_secs)
    return True
  except tf.errors.OpError:
    return False


def job_ended(task: Task, timeout_secs: float = 0.2) -> bool:
  """Whether the chief has stopped (reported), ending the job.

  False also when ps task 0 does not answer (`PsWatchdog` handles that).
  """
  target, device = ps_endpoint(task, 0)
  try:
    with control_session(target, device,
                          lambda: ended_queue().dequeue()) as (session,
                                                                dequeue):
      run_with_timeout(session, dequeue, timeout_secs)
  except tf.errors.OutOfRangeError:  # closed: the chief stopped.
    return True
  except tf.errors.OpError:  # DeadlineExceeded: still running; or no ps.
    return False
  return False
