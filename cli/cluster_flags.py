"""train.py on a cluster: its flags, and this process's task from them.

Every task runs train.py with the same --ps_hosts and --worker_hosts plus
its own --job_name and --task_index, or with a TF_CONFIG environment
variable instead (Kubeflow, Slurm: docs/distributed.md).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from absl import flags
from absl import logging

from estimator_multigpu.runtime import checkpoints
from estimator_multigpu import cluster

from cli import common_flags
from cli.model_dir_flags import check_model_dir

FLAGS = flags.FLAGS

flags.DEFINE_list("ps_hosts", None, "Cluster: ps addresses, host:port,...")
flags.DEFINE_list("worker_hosts", None, "Cluster: worker addresses, "
                  "host:port,... (the first is the chief).")
flags.DEFINE_enum("job_name", None, [cluster.PS, cluster.WORKER,
                                     cluster.EVALUATOR],
                  "Cluster: this task's job.")
flags.DEFINE_integer("task_index", 0, "Cluster: this task's index in its job "
                     "(worker 0 is the chief).")
flags.DEFINE_bool("sync_replicas", False, "Cluster: average one gradient "
                  "from each worker per step (SyncReplicasOptimizer); "
                  "default asynchronous updates.")
flags.DEFINE_integer("ps_wait_secs", 120, "Cluster: a worker fails if a ps "
                     "task does not answer within this time, at the start "
                     "or while training.")
flags.DEFINE_integer("ps_linger_secs", 60, "Cluster: a ps exits this long "
                     "after the chief finished even if a worker never "
                     "reported.")
flags.DEFINE_integer("eval_timeout_secs", 600, "Cluster: the evaluator stops "
                     "after this long without a new checkpoint.")


def cluster_task() -> Optional[cluster.Task]:
  """This process's cluster task (flags, else TF_CONFIG); None: local."""
  task = cluster.resolve_task(FLAGS.ps_hosts, FLAGS.worker_hosts,
                              FLAGS.job_name, FLAGS.task_index,
                              os.environ.get("TF_CONFIG"))
  if task is None and FLAGS.sync_replicas:
    raise ValueError("--sync_replicas synchronizes the workers of a cluster; "
                     "give --ps_hosts, --worker_hosts and --job_name (or "
                     "TF_CONFIG), or drop it.")
  return task


def trainer_number(task: Optional[cluster.Task]) -> int:
  """0 for the chief (or a local run), i for worker i of the flags."""
  if task is None or task.type != cluster.WORKER:
    return 0
  return task.index + 1


def replicas_to_aggregate(task: Optional[cluster.Task]) -> int:
  """Workers whose gradients each step averages; 0 for asynchronous."""
  return len(task.trainers) if task and FLAGS.sync_replicas else 0


def prepare_task(task: Optional[cluster.Task],
                 towers: common_flags.Towers) -> common_flags.Towers:
  """Checks the model dir where this task writes; tells Estimator the task.

  Returns:
    The towers, with the session config for this task.
  """
  if task is None or task.type in (cluster.CHIEF, cluster.EVALUATOR):
    check_model_dir(FLAGS.model_dir, FLAGS.min_free_disk_mb)
  if task is None or task.is_chief:
    checkpoints.prepare_model_dir(FLAGS.model_dir)
  if task is None:
    return towers
  os.environ["TF_CONFIG"] = task.tf_config()  # read by RunConfig.
  logging.info("Cluster task %s (TF_CONFIG=%s)", task.device,
               task.tf_config())
  return dataclasses.replace(towers, session_config=cluster.session_config(
      task, towers.session_config))


