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
  - `PsWatchdog`, `ChiefWatch` (in `watchdogs`, re-exported here): a
    trainer's watch on its ps tasks and its chief.
  - `abandon`: a trainer whose step cannot finish (a SIGTERM while a
    synchronous step waits for a dead worker) reports and exits.
  - `run_trainer`: all of it around one chief's or worker's `train` call.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from absl import logging
import tensorflow as tf

from estimator_multigpu.cluster.ps.control_queues import control_session
from estimator_multigpu.cluster.ps.control_queues import CONTROL_TIMEOUT_SECS
from estimator_multigpu.cluster.ps.control_queues import done_queue
from estimator_multigpu.cluster.ps.control_queues import ended_queue
from estimator_multigpu.cluster.ps.control_queues import job_ended
from estimator_multigpu.cluster.ps.control_queues import ps_endpoint
from estimator_multigpu.cluster.ps.control_queues import ready_queue
from estimator_multigpu.cluster.ps.control_queues import run_with_timeout
from estimator_multigpu.cluster.ps.control_queues import size_and_dequeue
from estimator_multigpu.cluster.ps.watchdogs import ChiefWatch
from estimator_multigpu.cluster.ps.watchdogs import PsWatchdog
from estimator_multigpu.cluster.task import CHIEF
from estimator_multigpu.cluster.task import exit_process
from estimator_multigpu.cluster.task import PS
from estimator_multigpu.cluster.task import start_server
from estimator_multigpu.cluster.task import Task

tf1 = tf.compat.v1

_SYNC_TOKEN_QUEUE = b"sync_token_q"  # SyncReplicasOptimizer's shared name.
_PS_DRAIN_SECS = 1.0  # lets the last reporters close their sessions.
_PS_POLL_SECS = 1.0  # how often a ps looks for trainers' reports.

def wait_for_ps(task: Task, timeout_secs: float, hint: str = "") -> None:
  """Returns once every ps task answers; raises after `timeout_secs` (the
  message ends with `hint`: where the cluster came from).

  Raises:
    TimeoutError: a ps task did not answer in time.
  """
  deadline = time.monotonic() + timeout_secs
  for index, host in enumerate(task.ps_hosts):
    target, device = ps_endpoint(task, index)
    while True:
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        raise TimeoutError(
            f"{task.device} waited {timeout_secs:g} s for ps task {index} at "
            f"{host}, which did not answer. Start the ps tasks (same cluster "
            "addresses, job ps), check that this address and port are right "
            "and reachable from this machine, or wait longer (train.py: "
            f"--ps_wait_secs). {hint}".strip())
      try:
        with control_session(target, device, lambda: tf.constant(0)) as (
            session, probe):
          run_with_timeout(session, probe, min(remaining, 10.0))
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
  target, device = ps_endpoint(task, 0)
  deadline = time.monotonic() + timeout_secs
  with control_session(target, device, lambda: ready_queue().dequeue()) as (
      session, dequeue):
    while time.monotonic() < deadline:
      try:
        run_with_timeout(session, dequeue, min(deadline - time.monotonic(), 10.0))
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
  """Tells every ps task that this trainer stopped (best effort).

  The chief also marks the job as ended, so the workers stop (`ChiefWatch`).
  """
  message = f"{task.type}:{task.index}:{'ok' if succeeded else 'failed'}"
  if task.is_chief:
    target, device = ps_endpoint(task, 0)
    try:
      with control_session(target, device,
                            lambda: ended_queue().close()) as (session, close):
        run_with_timeout(session, close, timeout_secs)
    except tf.errors.OpError as error:
      logging.warning("%s could not tell the workers that the job ended: %s",
                      task.device, error.message)
  for index, host in enumerate(task.ps_hosts):
    target, device = ps_endpoint(task, index)
    try:
      with control_session(target, device,
                            lambda: done_queue().enqueue([message])) as (
                                session, enqueue):
        run_with_timeout(session, enqueue, timeout_secs)
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
  with control_session(server.target, task.device, size_and_dequeue) as (
      session, (size, dequeue)):
    while pending and (chief_done_at is None or
                       time.monotonic() - chief_done_at < linger_secs):
      if not run_with_timeout(session, size, CONTROL_TIMEOUT_SECS):
        time.sleep(_PS_POLL_SECS)
        continue
      message = run_with_timeout(session, dequeue,
                                 CONTROL_TIMEOUT_SECS).decode()
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
      self._announce = ready_queue().close()
    if self._sync_replicas:
      self._close_tokens = _close_sync_token_queue(tf1.get_default_graph())

  def after_create_session(self, session, coord):
    self._coord = coord
    if self._announce is None:
      return
    try:
      session.run(self._announce)
    except tf.errors.CancelledError:
      # "Queue ... is already closed": this chief was restarted and the
      # workers already know the variables exist; it restored them again.
      logging.info("The chief rejoined its job: the workers had already "
                   "been told that the variables are initialized.")

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


def abandon(task: Task, signal_number: int, waited_secs: float) -> None:
  """Ends a trainer whose step did not finish after a stop signal.

  Reports to the ps tasks (so they exit), logs why, and exits with status
  128 + `signal_number`. No final checkpoint: the session is busy.
  """
  logging.error(
      "%s: signal %d arrived %.0f s ago, but the current step has not "
      "finished (in sync mode a step waits for every worker: is one dead?). "
      "Exiting now without a final checkpoint; a restart resumes from the "
      "newest checkpoint in the model dir.", task.device, signal_number,
      waited_secs)
  report_done(task, succeeded=False, timeout_secs=5.0)
  exit_process(128 + signal_number)


def run_trainer(task: Task, train: Callable[[list], Any], *,
                sync_replicas: bool,
                base_config: Optional[tf1.ConfigProto] = None,
                ps_wait_secs: float = 120.0,
                chief_wait_secs: float = 600.0,
                stop_requested: Callable[[], bool] = lambda: False,
                hint: str = "") -> Any:
  """Runs the chief or a worker: server, waits, `train(hooks)`, report.

  Args:
    task: a chief or worker task.
    train: calls `Estimator.train(..., hooks=[...] + hooks)` with the hooks
      it is given last, and returns anything.
    sync_replicas: the model_fn uses SyncReplicasOptimizer.
    base_config: the towers' session config (devices the server offers).
    ps_wait_secs: how long to wait for the ps tasks before failing, at the
      start and whenever one stops answering during training.
    chief_wait_secs: how long a worker waits for initialized variables, and
      for a chief that has gone away mid-job.
    stop_requested: whether a stop signal arrived (a paused worker then
      stops waiting for its chief).
    hint: what ends the error of a ps that never came (where the cluster
      came from, `cluster.source`).

  Returns:
    What `train` returned.

  Raises:
    RuntimeError: the job on these ps tasks has already ended.
  """
  _server = start_server(task, base_config)  # kept alive while training
  wait_for_ps(task, ps_wait_secs, hint)
  if job_ended(task, timeout_secs=1.0):
    raise RuntimeError(
        f"{task.device}: the job on ps tasks {', '.join(task.ps_hosts)} has "
        "already ended (its chief stopped); the ps tasks exit within "
        "--ps_linger_secs. Start the whole job again (ps tasks first); the "
        "chief resumes from the last checkpoint.")
  hooks = [ClusterHook(task.is_chief, sync_replicas)]
  if not task.is_chief:
    wait_for_chief(task, chief_wait_secs)
    hooks.insert(0, ChiefWatch(task, max_wait_secs=chief_wait_secs,
                               stop_requested=stop_requested))
  succeeded = False
  try:
    with PsWatchdog(task, ps_wait_secs):
      result = train(hooks)
    succeeded = True
    return result
  finally:
    report_done(task, succeeded)
