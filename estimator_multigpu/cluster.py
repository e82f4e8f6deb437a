"""Several machines: ps tasks hold the variables, workers run the towers.

A cluster has parameter-server (ps) tasks, a chief (worker 0, which also
initializes, checkpoints and writes summaries), more workers, and optionally
an evaluator outside the cluster. Estimator wraps the model_fn in
`replica_device_setter`: variables go to the ps tasks (round robin), every
other op to the worker. `multi_gpu`'s tower device function sits inside it
and adds the worker's local device, so tower i of worker k runs on
`/job:worker/task:k/device:GPU:i`, and each worker sums its towers' gradients
on its aggregation device before one copy per variable goes to the ps.

What this module adds to Estimator's own distributed mode (TensorFlow's gRPC
runtime throughout):
  - `Task`: the task this process runs, from the classic flags (worker 0
    becomes TF_CONFIG's `chief`, worker i > 0 becomes `worker` i - 1) or
    from a ready TF_CONFIG.
  - `start_server`: the task's server, exposing the towers' devices (Estimator
    starts it with the GPU options only, so virtual CPU towers would vanish).
  - `wait_for_ps`: a bounded wait, then a clear error, instead of a session
    that waits for an absent ps forever.
  - An end to the job: every trainer reports to a queue on each ps when it
    stops; `serve_ps` returns once the chief has reported and the other
    workers have (or `linger_secs` passed). Estimator's ps joins forever.
  - `ClusterHook`: the chief announces initialized variables (workers would
    otherwise poll every 30 s), and with `SyncReplicasOptimizer` it releases
    the workers waiting for a token and its own aggregation thread at the
    end (MonitoredSession would otherwise wait 120 s for that thread).
  - `exit_process`: a task's process can hang in TensorFlow's teardown of
    its server; tasks flush their files and leave at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from typing import Any, Callable, Optional, Sequence

from absl import logging
import tensorflow as tf

tf1 = tf.compat.v1

PS, CHIEF, WORKER, EVALUATOR = "ps", "chief", "worker", "evaluator"
TASK_TYPES = (PS, CHIEF, WORKER, EVALUATOR)
_DONE_QUEUE = "estimator_multigpu_done"
_READY_QUEUE = "estimator_multigpu_chief_ready"
_SYNC_TOKEN_QUEUE = b"sync_token_q"  # SyncReplicasOptimizer's shared name.
_CONTROL_TIMEOUT_SECS = 10
_PS_DRAIN_SECS = 1.0  # lets the last reporters close their sessions.


@dataclasses.dataclass(frozen=True)
class Task:
  """One task of a cluster: its job (`type`), its index, all addresses.

  `cluster` maps "ps", "chief" and "worker" to "host:port" lists, as in
  TF_CONFIG. The evaluator is not part of the training cluster.
  """
  cluster: dict
  type: str
  index: int

  @property
  def device(self) -> str:
    return f"/job:{self.type}/task:{self.index}"

  @property
  def is_chief(self) -> bool:
    return self.type == CHIEF

  @property
  def ps_hosts(self) -> list:
    return list(self.cluster[PS])

  @property
  def trainers(self) -> list:
    """`chief:0`, `worker:0`, ...: the tasks that run training steps."""
    return [f"{CHIEF}:0"] + [f"{WORKER}:{i}" for i in
                             range(len(self.cluster.get(WORKER, [])))]

  def tf_config(self) -> str:
    """The TF_CONFIG value (JSON) that describes this task to Estimator."""
    return json.dumps({"cluster": self.cluster,
                       "task": {"type": self.type, "index": self.index}})


def task_from_flags(ps_hosts: Sequence[str], worker_hosts: Sequence[str],
                    job_name: Optional[str], task_index: int) -> Task:
  """The task for the classic flags; worker 0 is the chief.

  Raises:
    ValueError: a list is empty, `job_name` is not ps, worker or evaluator,
      or `task_index` is outside the job's host list.
  """
  for name, hosts in (("ps_hosts", ps_hosts), ("worker_hosts", worker_hosts)):
    if not hosts:
      raise ValueError(
          f"--{name} is empty; a cluster needs at least one ps and one worker "
          "address, e.g. --ps_hosts=ps0:2222 --worker_hosts=w0:2222,w1:2222, "
          "the same on every task.")
  if job_name not in (PS, WORKER, EVALUATOR):
    raise ValueError(f"--job_name is {job_name!r}; expected ps, worker or "
                     "evaluator (worker 0 is the chief).")
  cluster = {PS: list(ps_hosts), CHIEF: [worker_hosts[0]]}
  if len(worker_hosts) > 1:
    cluster[WORKER] = list(worker_hosts[1:])
  hosts = {PS: ps_hosts, WORKER: worker_hosts}.get(job_name)
  if hosts is not None and not 0 <= task_index < len(hosts):
    raise ValueError(
        f"--task_index={task_index} but --{job_name}_hosts lists "
        f"{len(hosts)} address(es); expected 0..{len(hosts) - 1}.")
  if job_name == WORKER:
    task_type, index = (CHIEF, 0) if task_index == 0 else (WORKER,
                                                             task_index - 1)
  else:
    task_type, index = job_name, task_index
  return check_task(Task(cluster, task_type, index))


def task_from_tf_config(text: str) -> Optional[Task]:
  """The task TF_CONFIG describes; None when it has no cluster (local run).

  Raises:
    ValueError: TF_CONFIG is not JSON or does not describe a ps cluster.
  """
  try:
    config = json.loads(text)
  except ValueError as error:
    raise ValueError(f"TF_CONFIG is not JSON ({error}): {text[:200]!r}. "
                     "Example: {\"cluster\": {\"chief\": [\"w0:2222\"], "
                     "\"ps\": [\"ps0:2222\"]}, \"task\": {\"type\": "
                     "\"chief\", \"index\": 0}}") from error
  if not config.get("cluster"):
    return None
  task = config.get("task") or {}
  cluster = {job: list(hosts) for job, hosts in config["cluster"].items()}
  return check_task(Task(cluster, task.get("type"),
                         int(task.get("index", 0))))


def check_task(task: Task) -> Task:
  """Checks that `task` is a ps/chief/worker cluster task or an evaluator."""
  unknown = sorted(set(task.cluster) - {PS, CHIEF, WORKER})
  if unknown or len(task.cluster.get(CHIEF, [])) != 1 or not task.cluster.get(
      PS):
    raise ValueError(
        f"The cluster has jobs {sorted(task.cluster)} with "
        f"{len(task.cluster.get(CHIEF, []))} chief(s) and "
        f"{len(task.cluster.get(PS, []))} ps; expected exactly one chief, at "
        "least one ps and optionally workers (rename a `master` job to "
        "`chief`; without ps tasks, train on one machine instead).")
  if task.type not in TASK_TYPES:
    raise ValueError(f"The task type is {task.type!r}; expected one of "
                     f"{', '.join(TASK_TYPES)}.")
  hosts = task.cluster.get(task.type)
  if task.type != EVALUATOR and not 0 <= task.index < len(hosts or []):
    raise ValueError(
        f"Task {task.type}:{task.index} is not in the cluster, whose "
        f"`{task.type}` job has {len(hosts or [])} task(s).")
  return task


def resolve_task(ps_hosts: Optional[Sequence[str]],
                 worker_hosts: Optional[Sequence[str]],
                 job_name: Optional[str], task_index: int,
                 tf_config: Optional[str]) -> Optional[Task]:
  """The task from the flags, else from TF_CONFIG; None for a local run.

  Raises:
    ValueError: both describe a cluster, or either is malformed.
  """
  from_flags = bool(ps_hosts or worker_hosts or job_name)
  from_env = task_from_tf_config(tf_config) if tf_config else None
  if from_flags and from_env is not None:
    raise ValueError(
        "Both --ps_hosts/--worker_hosts/--job_name and the TF_CONFIG "
        "environment variable describe the cluster; give only one (unset "
        "TF_CONFIG, or drop the flags).")
  if from_flags:
    return task_from_flags(ps_hosts or [], worker_hosts or [], job_name,
                           task_index)
  return from_env


def server_config(task: Task,
                  base: Optional[tf1.ConfigProto]) -> tf1.ConfigProto:
  """What the task's server offers: the towers' devices; a ps gets one CPU."""
  if task.type == PS:
    return tf1.ConfigProto(device_count={"GPU": 0})
  config = tf1.ConfigProto()
  if base is not None:
    config.CopyFrom(base)
  del config.device_filters[:]
  return config


def session_config(task: Task,
                   base: Optional[tf1.ConfigProto]) -> tf1.ConfigProto:
  """`base` with device filters: a trainer sees the ps tasks and itself only.

  So it neither waits for the other workers when its session starts nor
  fails when one of them dies.
  """
  config = tf1.ConfigProto()
  if base is not None:
    config.CopyFrom(base)
  if task.type in (CHIEF, WORKER):
    config.device_filters[:] = [f"/job:{PS}", task.device]
  return config


def start_server(task: Task, base: Optional[tf1.ConfigProto] = None
                 ) -> tf.distribute.Server:
  """Starts this task's gRPC server (keep the returned object alive)."""
  server = tf.distribute.Server(
      tf.train.ClusterSpec(task.cluster), job_name=task.type,
      task_index=task.index, config=server_config(task, base), start=True)
  logging.info("Started %s at %s", task.device, server.target)
  return server


def _done_queue() -> tf1.FIFOQueue:
  return tf1.FIFOQueue(1000, [tf.string], shapes=[[]], name="done_queue",
                       shared_name=_DONE_QUEUE)


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
  with _control_session(server.target, task.device,
                        lambda: _done_queue().dequeue()) as (session, dequeue):
    while pending and (chief_done_at is None or
                       time.monotonic() - chief_done_at < linger_secs):
      try:
        message = _run(session, dequeue, 1.0).decode()
      except tf.errors.DeadlineExceededError:
        continue
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
    ps_wait_secs: how long to wait for the ps tasks before failing.
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
    result = train([ClusterHook(task.is_chief, sync_replicas)])
    succeeded = True
    return result
  finally:
    report_done(task, succeeded)


def exit_process(status: int) -> None:
  """Flushes summaries and logs, then ends the process at once.

  A process with a gRPC server can take tens of seconds, or forever, in
  TensorFlow's C++ teardown at a normal exit (clean server shutdown is not
  implemented), so cluster tasks leave through `os._exit`.
  """
  tf1.summary.FileWriterCache.clear()  # closes (flushes) every event file.
  logging.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access


def evaluate_checkpoints(estimator: tf.estimator.Estimator, input_fn,
                         max_steps: Optional[int],
                         timeout_secs: float) -> dict:
  """Evaluates each new checkpoint until one is at or past `max_steps`.

  Raises:
    TimeoutError: no new checkpoint for `timeout_secs` before that.
  """
  metrics = None
  for checkpoint in tf.train.checkpoints_iterator(estimator.model_dir,
                                                  timeout=timeout_secs):
    metrics = estimator.evaluate(input_fn, checkpoint_path=checkpoint)
    logging.info("Evaluated %s: %s", checkpoint, metrics)
    if max_steps is None or metrics["global_step"] >= max_steps:
      return metrics
  last = "none" if metrics is None else f"step {metrics['global_step']}"
  raise TimeoutError(
      f"No new checkpoint appeared in {estimator.model_dir} for "
      f"{timeout_secs:g} s (last evaluated: {last}; waiting for step "
      f"{max_steps}). Check that the chief is running and writes to this "
      "model_dir, or wait longer.")
