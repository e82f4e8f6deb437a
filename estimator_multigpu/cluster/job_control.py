"""The start and end of a cluster job, beyond what Estimator does.

TensorFlow's gRPC runtime throughout; the messages travel through small
shared queues on the ps tasks, driven from side sessions with timeouts.
  - `wait_for_ps`: a bounded wait, then a clear error, instead of a session
    that waits for an absent ps forever.
  - `wait_for_chief`: the chief announces initialized variables; workers
    would otherwise poll every 30 s.
  - An end to the job: every trainer reports to a queue on each ps when it
    stops (`report_done`); `serve_ps` returns once the chief has reported
    and the other workers have (or `linger_secs` passed). Estimator's ps
    joins forever.
  - `ClusterHook`: the chief's announcement, and with `SyncReplicasOptimizer`
    the release of the workers waiting for a token and of its own
    aggregation thread at the end (MonitoredSession would otherwise wait
    120 s for that thread).
  - `PsWatchdog`: a trainer whose ps stops answering mid-job exits with a
    clear error after `ps_wait_secs` instead of waiting forever.
  - `run_trainer`: all of it around one chief's or worker's `train` call.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Optional

from absl import logging
import tensorflow as tf

from estimator_multigpu.cluster.task import CHIEF, PS, Task, exit_process
from estimator_multigpu.cluster.task import start_server

tf1 = tf.compat.v1

_DONE_QUEUE = "estimator_multigpu_done"
_READY_QUEUE = "estimator_multigpu_chief_ready"
_SYNC_TOKEN_QUEUE = b"sync_token_q"  # SyncReplicasOptimizer's shared name.
_CONTROL_TIMEOUT_SECS = 10
_PS_DRAIN_SECS = 1.0  # lets the last reporters close their sessions.
_PS_POLL_SECS = 1.0  # how often a ps looks for trainers' reports.


def _done_queue() -> tf1.FIFOQueue:
  return tf1.FIFOQueue(1000, [tf.string], shapes=[[]], name="done_queue",
                       shared_name=_DONE_QUEUE)


def _size_and_dequeue() -> tuple:
  queue = _done_queue()
  return queue.size(), queue.dequeue()


def _ready_queue() -> tf1.FIFOQueue:
  return tf1.FIFOQueue(1, [tf.int32], shapes=[[]], name="chief_ready_queue",
                       shared_name=_READY_QUEUE)


@contextlib.contextmanager
def _control_session(target: str, device: str, build: Callable):
  """A session on `target` running the op `build()` places on `device`.

  Its calls time out after `_CONTROL_TIMEOUT_SECS` unless a run says
  otherwise: closing a session on a ps that just exited would wait forever.
  """
  graph = tf.Graph()
  with graph.as_default(), tf.device(device):
    fetch = build()
  config = tf1.ConfigProto(device_filters=[device], operation_timeout_in_ms=(
      _CONTROL_TIMEOUT_SECS * 1000))
  with tf1.Session(target, graph=graph, config=config) as session:
    yield session, fetch


def _run(session: tf1.Session, fetch: Any, timeout_secs: float) -> Any:
  options = tf1.RunOptions(timeout_in_ms=max(int(timeout_secs * 1000), 1))
  return session.run(fetch, options=options)


def _ps(task: Task, index: int) -> tuple:
  return f"grpc://{task.ps_hosts[index]}", f"/job:{PS}/task:{index}"


def wait_for_ps(task: Task, timeout_secs: float) -> None:
  """Returns once every ps task answers; raises after `timeout_secs`.

  Raises:
    TimeoutError: a ps task did not answer in time.
  """
  deadline = time.monotonic() + timeout_secs
  for index, host in enumerate(task.ps_hosts):
    target, device = _ps(task, index)
    while True:
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        raise TimeoutError(
            f"{task.device} waited {timeout_secs:g} s for ps task {index} at "
            f"{host}, which did not answer. Start the ps tasks (same cluster "
            "addresses, job ps), check that this address and port are right "
            "and reachable from this machine, or wait longer (train.py: "
            "--ps_wait_secs).")
      try:
        with _control_session(target, device, lambda: tf.constant(0)) as (
            session, probe):
          _run(session, probe, min(remaining, 10.0))
        break
      except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError):
        logging.info("%s: waiting for ps task %d at %s (%.0f s left)",
                     task.device, index, host, remaining)
        time.sleep(min(1.0, max(deadline - time.monotonic(), 0.0)))


def wait_for_chief(task: Task, timeout_secs: float) -> bool:
  """Waits until the chief has initialized (or restored) the variables.

  Returns:
    Whether it did within `timeout_secs` (if not, Estimator's own check
    takes over, which polls every 30 s).
  """
  target, device = _ps(task, 0)
  deadline = time.monotonic() + timeout_secs
  with _control_session(target, device, lambda: _ready_queue().dequeue()) as (
      session, dequeue):
    while time.monotonic() < deadline:
      try:
        _run(session, dequeue, min(deadline - time.monotonic(), 10.0))
      except tf.errors.OutOfRangeError:  # closed by the chief: ready.
        return True
      except tf.errors.DeadlineExceededError:
        logging.info("%s: waiting for the chief to initialize the "
                     "variables", task.device)
  logging.warning("%s: the chief did not announce initialized variables "
                  "within %g s; starting anyway.", task.device, timeout_secs)
  return False


def report_done(task: Task, succeeded: bool,
                timeout_secs: float = 10.0) -> None:
  """Tells every ps task that this trainer stopped (best effort)."""
  message = f"{task.type}:{task.index}:{'ok' if succeeded else 'failed'}"
  for index, host in enumerate(task.ps_hosts):
    target, device = _ps(task, index)
    try:
      with _control_session(target, device,
                            lambda: _done_queue().enqueue([message])) as (
                                session, enqueue):
        _run(session, enqueue, timeout_secs)
    except tf.errors.OpError as error:
      logging.warning("%s could not report to ps task %d at %s that it "
                      "stopped: %s", task.device, index, host, error.message)


def serve_ps(task: Task, linger_secs: float = 60.0) -> list:
  """Serves as a ps task until the job is finished, then returns.

  Finished: the chief reported that it stopped, and so did every worker, or
  `linger_secs` passed since the chief's report. A chief killed without
  reporting can be restarted: the ps keeps serving.

  Returns:
    The trainers that never reported (empty when all did).
  """
  server = start_server(task)
  pending, chief_done_at = set(task.trainers), None
  logging.info("ps task %d serving at %s until %s stop", task.index,
               server.target, ", ".join(sorted(pending)))
  # Polls the queue's size and dequeues only what is there: a dequeue that
  # times out is cancelled, and TensorFlow logs every cancelled dequeue
  # ("Skipping cancelled dequeue attempt"), once a second for a whole job.
  with _control_session(server.target, task.device, _size_and_dequeue) as (
      session, (size, dequeue)):
    while pending and (chief_done_at is None or
                       time.monotonic() - chief_done_at < linger_secs):
      if not _run(session, size, _CONTROL_TIMEOUT_SECS):
        time.sleep(_PS_POLL_SECS)
        continue
      message = _run(session, dequeue, _CONTROL_TIMEOUT_SECS).decode()
      trainer, status = message.rsplit(":", 1)
      pending.discard(trainer)
      logging.info("ps task %d: %s stopped (%s)", task.index, trainer, status)
      if trainer == f"{CHIEF}:0":
        chief_done_at = time.monotonic()
  if pending:
    logging.warning("ps task %d: stopping %g s after the chief without a "
                    "report from %s.", task.index, linger_secs,
                    ", ".join(sorted(pending)))
  logging.info("ps task %d: the job is finished; exiting.", task.index)
  time.sleep(_PS_DRAIN_SECS)
  return sorted(pending)


class ClusterHook(tf1.train.SessionRunHook):
  """Start and end of the job for a trainer; pass it as the last hook.

  On the chief: once the session exists (variables initialized or restored)
  it tells the waiting workers (`wait_for_chief`). With `sync_replicas`, its
  `end` closes SyncReplicasOptimizer's token queue, so workers waiting for a
  token stop cleanly, then closes the session, which cancels the chief's
  aggregation thread (blocked until more gradients arrive) instead of
  MonitoredSession waiting 120 s for it. Hooks after this one must not use
  the session in `end`.
  """

  def __init__(self, is_chief: bool, sync_replicas: bool):
    self._is_chief = is_chief
    self._sync_replicas = sync_replicas
    self._coord = None

  def begin(self):
    self._announce = self._close_tokens = None
    if not self._is_chief:
      return
    with tf.device(f"/job:{PS}/task:0"):
      self._announce = _ready_queue().close()
    if self._sync_replicas:
      self._close_tokens = _close_sync_token_queue(tf1.get_default_graph())

  def after_create_session(self, session, coord):
    self._coord = coord
    if self._announce is not None:
      session.run(self._announce)

  def end(self, session):
    if self._close_tokens is None:
      return
    # Stop first, so the aggregation thread's failing step is not an error.
    # The stop also makes its queue runner close the token queue, but in
    # another thread: close it here too, before the session goes.
    self._coord.request_stop()
    try:
      session.run(self._close_tokens)
    except tf.errors.CancelledError:  # "already closed" by that thread.
      pass
    session.close()


def _close_sync_token_queue(graph: tf.Graph) -> tf.Operation:
  queues = [op for op in graph.get_operations() if op.type == "FIFOQueueV2"
            and op.get_attr("shared_name") == _SYNC_TOKEN_QUEUE]
  if not queues:
    raise ValueError(
        "`sync_replicas` is set but the graph has no SyncReplicasOptimizer; "
        "wrap the optimizer: TowerOptimizer(tf.compat.v1.train."
        "SyncReplicasOptimizer(opt, replicas_to_aggregate=n, "
        "total_num_replicas=n)), or train asynchronously.")
  with tf1.colocate_with(queues[0]):
    return tf.raw_ops.QueueCloseV2(handle=queues[0].outputs[0])


def _answers(task: Task, index: int, timeout_secs: float) -> bool:
  """Whether ps task `index` runs a trivial op within `timeout_secs`."""
  target, device = _ps(task, index)
  try:
    with _control_session(target, device, lambda: tf.constant(0)) as (
        session, probe):
      _run(session, probe, timeout_secs)
    return True
  except tf.errors.OpError:
    return False


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
        if _answers(self._task, index, self._probe):
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


def run_trainer(task: Task, train: Callable[[list], Any], *,
                sync_replicas: bool,
                base_config: Optional[tf1.ConfigProto] = None,
                ps_wait_secs: float = 120.0,
                chief_wait_secs: float = 600.0) -> Any:
  """Runs the chief or a worker: server, waits, `train(hooks)`, report.

  Args:
    task: a chief or worker task.
    train: calls `Estimator.train(..., hooks=[...] + hooks)` with the hooks
      it is given last, and returns anything.
    sync_replicas: the model_fn uses SyncReplicasOptimizer.
    base_config: the towers' session config (devices the server offers).
    ps_wait_secs: how long to wait for the ps tasks before failing, at the
      start and whenever one stops answering during training.
    chief_wait_secs: how long a worker waits for initialized variables.

  Returns:
    What `train` returned.
  """
  server = start_server(task, base_config)  # pylint: disable=unused-variable
  wait_for_ps(task, ps_wait_secs)
  if not task.is_chief:
    wait_for_chief(task, chief_wait_secs)
  succeeded = False
  try:
    with PsWatchdog(task, ps_wait_secs):
      result = train([ClusterHook(task.is_chief, sync_replicas)])
    succeeded = True
    return result
  finally:
    report_done(task, succeeded)
