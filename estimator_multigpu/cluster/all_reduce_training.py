"""`train_and_evaluate` for an all-reduce job (chief + workers, no ps).

`tf.estimator.train_and_evaluate` starts each task's server with only the
session config's GPU options (a CPU host's virtual devices vanish) and no
collective group leader, and non-chief workers wait for variables nobody
initializes. This drop-in, with the same signature, does what such a job
needs and hands everything else to TensorFlow's:

- chief and workers of an all-reduce cluster (`all_reduce_job`): start the
  server with the session config's devices and the group leader, give the
  Estimator's sessions the leader too, then train under a `PeerWatch`
  (`health`), every task on its own `input_fn`;
- anything else (no cluster, a ps cluster, the evaluator): TensorFlow's
  `train_and_evaluate`.
"""

from __future__ import annotations

from typing import Any, Callable

from absl import logging
import tensorflow as tf

from estimator_multigpu.cluster import all_reduce_job
from estimator_multigpu.cluster import health

tf1 = tf.compat.v1


def train_and_evaluate(estimator: tf.estimator.Estimator,
                       train_spec: tf.estimator.TrainSpec,
                       eval_spec: tf.estimator.EvalSpec, *,
                       peer_timeout_secs: float = health.DEFAULT_TIMEOUT_SECS
                       ) -> Any:
  """Trains (and evaluates) like `tf.estimator.train_and_evaluate`.

  Args:
    estimator, train_spec, eval_spec: as for TensorFlow's.
    peer_timeout_secs: in an all-reduce cluster, how long another training
      task may not answer before this one ends with status 1.

  Returns:
    TensorFlow's result; (None, None) on the chief and workers of an
    all-reduce cluster, whose evaluator evaluates the chief's checkpoints.
  """
  cluster = all_reduce_job.AllReduceCluster.from_run_config(estimator.config)
  if cluster is None:
    return tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
  run_task(estimator, lambda: estimator.train(
      train_spec.input_fn, hooks=list(train_spec.hooks),
      max_steps=train_spec.max_steps), peer_timeout_secs)
  return None, None


def run_task(estimator: tf.estimator.Estimator, train: Callable[[], Any],
             peer_timeout_secs: float = health.DEFAULT_TIMEOUT_SECS) -> Any:
  """Starts this all-reduce task's server, then `train()` under a
  `PeerWatch`; returns what `train` returned.

  Raises:
    ValueError: the Estimator's RunConfig (TF_CONFIG) is no all-reduce
      cluster's chief or worker.
  """
  cluster = all_reduce_job.AllReduceCluster.from_run_config(estimator.config)
  if cluster is None:
    raise ValueError(
        "run_task needs TF_CONFIG to describe a chief or worker of a cluster "
        "with a chief, workers and no ps; got task "
        f"{estimator.config.task_type!r} of {estimator.config.cluster_spec}.")
  server = start_server(cluster, estimator)
  logging.info("All-reduce task %s of %d started at %s",
               cluster.tasks[cluster.position], len(cluster.tasks),
               server.target)
  with health.PeerWatch(peers(cluster), peer_timeout_secs) as watch:
    try:
      return train()
    except tf.errors.OpError:
      watch.end_if_a_peer_is_gone()
      raise


def start_server(cluster: all_reduce_job.AllReduceCluster,
                 estimator: tf.estimator.Estimator) -> tf.distribute.Server:
  """This task's server, and the Estimator's sessions, with the group leader
  and the session config's devices."""
  config = all_reduce_job.server_config(cluster,
                                        estimator.config.session_config)
  estimator._session_config = config  # pylint: disable=protected-access
  return tf.distribute.Server(
      tf.train.ClusterSpec(cluster.cluster), job_name=cluster.task_type,
      task_index=cluster.task_index, config=config, start=True)


def peers(cluster: all_reduce_job.AllReduceCluster) -> dict:
  """{task name: address} of the other training tasks."""
  addresses = {f"{job}:{index}": address
               for job, hosts in cluster.cluster.items()
               for index, address in enumerate(hosts)}
  me = f"{cluster.task_type}:{cluster.task_index}"
  return {name: address for name, address in addresses.items()
          if name != me}
