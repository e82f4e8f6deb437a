"""train.py on a cluster: this process's task from the cluster settings.

Every task runs train.py with the same --ps_hosts and --worker_hosts plus
its own --job_name and --task_index, or with a TF_CONFIG environment
variable instead (Kubeflow, Slurm: docs/distributed.md).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional

from absl import logging

from estimator_multigpu import cluster
from estimator_multigpu.cluster import source
from estimator_multigpu.runtime import checkpoints as checkpoints_lib

from cli import settings as settings_lib
from cli import towers as towers_lib


def cluster_task(settings: settings_lib.ClusterSettings,
                 tf_config: Optional[str]) -> Optional[cluster.Task]:
  """This process's cluster task (the settings, else `tf_config`, the
  TF_CONFIG environment variable); None: a local run.

  Raises:
    ValueError: `sync_replicas` without a cluster, or bad cluster settings.
  """
  task = cluster.resolve_task(
      _list(settings.ps_hosts), _list(settings.worker_hosts),
      settings.job_name, settings.task_index, tf_config)
  if task is None and settings.sync_replicas:
    raise ValueError("--sync_replicas synchronizes the workers of a cluster; "
                     "give --ps_hosts, --worker_hosts and --job_name (or "
                     "TF_CONFIG), or drop it.")
  return task


def cluster_source(settings: settings_lib.ClusterSettings,
                   environ: Optional[Mapping[str, str]] = None
                   ) -> source.Source:
  """Where this task's cluster comes from: the launcher, the cluster flags
  or TF_CONFIG (`cluster_task`'s order)."""
  return source.detect(bool(settings.ps_hosts or settings.worker_hosts or
                            settings.job_name), environ)


def start_line(task: cluster.Task, settings: settings_lib.ClusterSettings
               ) -> str:
  """A cluster task's first line: which task, of which cluster, from where."""
  me = f"{task.type}:{task.index}"
  names = task_names(task, settings.worker_hosts is not None)
  return cluster_source(settings).start_line(names.get(me, me), task.cluster)


def _list(hosts):
  return None if hosts is None else list(hosts)


def trainer_number(task: Optional[cluster.Task]) -> int:
  """0 for the chief (or a local run), i for worker i of the flags."""
  if task is None or task.type != cluster.WORKER:
    return 0
  return task.index + 1


def replicas_to_aggregate(task: Optional[cluster.Task],
                          sync_replicas: bool) -> int:
  """Workers whose gradients each step averages; 0 for asynchronous."""
  return len(task.trainers) if task and sync_replicas else 0


def prepare_task(task: Optional[cluster.Task], towers: towers_lib.Towers,
                 model_dir: str) -> towers_lib.Towers:
  """Prepares the model dir where this task saves (the chief, a local run;
  cli/model_dir/checkpoints.py `writer_lock` has checked it can); tells
  Estimator the task.

  Returns:
    The towers, with the session config for this task.
  """
  if task is None or task.is_chief:
    checkpoints_lib.prepare_model_dir(model_dir)
  if task is None:
    return towers
  os.environ["TF_CONFIG"] = task.tf_config()  # read by RunConfig.
  logging.info("Cluster task %s: Estimator's RunConfig reads TF_CONFIG=%s",
               task.device, task.tf_config())
  return dataclasses.replace(towers, session_config=cluster.session_config(
      task, towers.session_config))


def check_tf_config(tf_config: Optional[str]) -> None:
  """eval.py and export.py: a TF_CONFIG left in the environment, which
  Estimator's RunConfig reads, must at least parse (train.py reads it as
  its task).

  Raises:
    ValueError: naming TF_CONFIG, its text and an example.
  """
  if not tf_config:
    return
  try:
    cluster.task_from_tf_config(tf_config)
  except ValueError as error:
    raise ValueError(f"{error}. For a run on this machine only, unset "
                     "TF_CONFIG (unset TF_CONFIG in the shell).") from error


def task_names(task: cluster.Task, by_flags: bool) -> dict:
  """{task ("worker:0"): how it was started}, for the messages: with the
  classic flags worker i is `--task_index=i` (0: the chief), so TF_CONFIG's
  `worker:0` is `worker --task_index=1`."""
  trainers = task.trainers
  if not by_flags:
    return {name: name for name in trainers}
  return {name: (f"worker --task_index={number}"
                 f"{' (the chief)' if number == 0 else ''}")
          for number, name in enumerate(trainers)}
