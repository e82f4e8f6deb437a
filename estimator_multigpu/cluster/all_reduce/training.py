"""`train_and_evaluate` for an all-reduce job (chief + workers, no ps).

`tf.estimator.train_and_evaluate` starts each task's server with only the
session config's GPU options (a CPU host's virtual devices vanish) and no
collective group leader, and non-chief workers wait for variables nobody
initializes. This drop-in, with the same signature, does what such a job
needs and hands everything else to TensorFlow's:

- chief and workers of an all-reduce cluster (`servers`): start the
  server with the session config's devices and the group leader, give the
  Estimator's sessions the leader too, then train under a `PeerWatch`
  (`peer_probe`: a process gone) and a `JobGuard` (`guard`: heartbeats,
  the tasks' settings compared, stop signals), every task on its own
  `input_fn`;
- anything else (no cluster, a ps cluster, the evaluator): TensorFlow's
  `train_and_evaluate`.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional

from absl import logging
import tensorflow as tf

from estimator_multigpu import collectives
from estimator_multigpu import compat
from estimator_multigpu.cluster import source as source_lib
from estimator_multigpu.cluster.all_reduce import guard as guard_lib
from estimator_multigpu.cluster.all_reduce import heartbeat
from estimator_multigpu.cluster.all_reduce import peer_probe
from estimator_multigpu.cluster.all_reduce import servers
from estimator_multigpu.cross_tower import across_tasks

tf1 = tf.compat.v1
_GUARDS: list = []  # the running task's JobGuard (`abandon`).


def train_and_evaluate(estimator: tf.estimator.Estimator,
                       train_spec: tf.estimator.TrainSpec,
                       eval_spec: tf.estimator.EvalSpec, *,
                       peer_timeout_secs: float = peer_probe.DEFAULT_TIMEOUT_SECS
                       ) -> Any:
  """Trains (and evaluates) like `tf.estimator.train_and_evaluate`.

  Args:
    estimator: as for TensorFlow's `train_and_evaluate`.
    train_spec: as for TensorFlow's.
    eval_spec: as for TensorFlow's.
    peer_timeout_secs: in an all-reduce cluster, how long another training
      task may not answer, or make no progress, before this one ends with
      status 1.

  Returns:
    TensorFlow's result; (None, None) on the chief and workers of an
    all-reduce cluster, whose evaluator evaluates the chief's checkpoints.
  """
  cluster = across_tasks.AllReduceCluster.from_run_config(estimator.config)
  if cluster is None:
    return tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
  run_task(estimator, lambda hooks: estimator.train(
      train_spec.input_fn, hooks=hooks + list(train_spec.hooks),
      max_steps=train_spec.max_steps), peer_timeout_secs,
           max_steps=train_spec.max_steps)
  return None, None


def run_task(estimator: tf.estimator.Estimator,
             train: Callable[[list], Any],
             peer_timeout_secs: float = peer_probe.DEFAULT_TIMEOUT_SECS, *,
             max_steps: Optional[int] = None, names: Optional[dict] = None,
             settings: Optional[dict] = None,
             setting_names: Optional[dict] = None,
             stop_received: Optional[Callable[[], Optional[int]]] = None,
             on_stop: Callable[[int], None] = lambda number: None,
             grace_secs: float = 30.0,
             source: Optional[source_lib.Source] = None) -> Any:
  """Starts this all-reduce task's server, then `train(hooks)` under a
  `PeerWatch` and a `guard.JobGuard`; returns what `train` returned
  (None when the chief has nothing left to train).

  Args:
    estimator: the task's Estimator (TF_CONFIG's cluster).
    train: calls `estimator.train(..., hooks=hooks + ...)` with the given
      hooks first.
    peer_timeout_secs: how long a peer may not answer or make progress.
    max_steps: the run's last step (all tasks return when the chief's
      checkpoint is there).
    names: {task ("worker:0"): how it was started}, for the messages.
    settings: {setting: value} every task must share; `setting_names`:
      {setting: how the user sets it}.
    stop_received: the stop signal received, if any (`SignalStop`): the
      job then stops at one step, the chief saving it (`stop_signal`; one
      small board call per step). None: no stop is agreed.
    on_stop: called with the signal when the job stopped so (this task's
      one line is logged).
    grace_secs: how long after a stop signal the task may take to end.
    source: where the cluster came from (`cluster.source`), for the lines;
      default: the launcher if it started this process, else TF_CONFIG.

  Raises:
    ValueError: the Estimator's RunConfig (TF_CONFIG) is no all-reduce
      cluster's chief or worker.
    OSError: this task's address cannot be listened on.
  """
  cluster = across_tasks.AllReduceCluster.from_run_config(estimator.config)
  if cluster is None:
    raise ValueError(
        "run_task needs TF_CONFIG to describe a chief or worker of a cluster "
        "with a chief, workers and no ps; got task "
        f"{estimator.config.task_type!r} of {estimator.config.cluster_spec}.")
  collectives.restart_keys()  # the same keys on every task.
  source = source or source_lib.detect()
  server = start_server(cluster, estimator)
  logging.info("All-reduce task %s of %d started at %s (its cluster given "
               "by %s)", cluster.tasks[cluster.position], len(cluster.tasks),
               server.target, source)
  guard = guard_lib.JobGuard(cluster, server.target, estimator.model_dir,
                             peer_timeout_secs, names, settings,
                             setting_names, stop_received, source.end_hint)
  with peer_probe.PeerWatch(
      peers(cluster, guard.names), peer_timeout_secs, on_dead=guard.peer_gone,
      hint=source.end_hint) as watch, guard, _current(guard):
    guard.watch_stop(grace_secs)
    if not guard.greet(max_steps):
      return None
    try:
      result = train(guard.hooks())
    except tf.errors.OpError as error:
      watch.end_if_a_peer_is_gone()
      guard.failed(error)  # the peers end naming this error, not this task.
      raise
    stopped = guard.finish_stop(grace_secs / 2)
    if stopped is not None:
      on_stop(stopped)
    return result


@contextlib.contextmanager
def _current(guard: guard_lib.JobGuard):
  """`abandon` reaches the running task's guard."""
  _GUARDS.append(guard)
  try:
    yield
  finally:
    _GUARDS.remove(guard)


def abandon(signal_number: int, waited_secs: float) -> None:
  """`SignalStop`'s `on_blocked` for an all-reduce task: a stop signal
  whose step did not finish; one line, exit 128 + signal."""
  if _GUARDS:
    _GUARDS[-1].abandon(signal_number, waited_secs)
  heartbeat.end_task(
      f"Signal {signal_number} arrived {waited_secs:.0f} s ago, but this "
      "task has not stopped; exiting without a final checkpoint (the "
      "newest checkpoint in the model dir stands).", 128 + signal_number)


def start_server(cluster: across_tasks.AllReduceCluster,
                 estimator: tf.estimator.Estimator) -> tf.distribute.Server:
  """This task's server, and the Estimator's sessions, with the group leader
  and the session config's devices.

  Raises:
    OSError: the server cannot listen on this task's address.
  """
  config = servers.server_config(cluster, estimator.config.session_config)
  compat.set_private(estimator, "_session_config", config)
  address = cluster.cluster[cluster.task_type][cluster.task_index]
  try:
    return tf.distribute.Server(
        tf.train.ClusterSpec(cluster.cluster), job_name=cluster.task_type,
        task_index=cluster.task_index, config=config, start=True)
  except (tf.errors.OpError, RuntimeError) as error:
    raise OSError(
        f"Task {cluster.task_type}:{cluster.task_index} cannot listen on "
        f"its address {address} (port {address.rsplit(':', 1)[-1]}): "
        f"{getattr(error, 'message', error)}. Another process listens there "
        "(this task already running, or another job); stop it or give this "
        "task a free port, the same in every task's cluster.") from error


def peers(cluster: across_tasks.AllReduceCluster,
          names: Optional[dict] = None) -> dict:
  """{task name (as started): address} of the other training tasks."""
  addresses = {f"{job}:{index}": address
               for job, hosts in cluster.cluster.items()
               for index, address in enumerate(hosts)}
  me = f"{cluster.task_type}:{cluster.task_index}"
  return {(names or {}).get(name, name): address
          for name, address in addresses.items() if name != me}
