"""The cluster task from the parsed flags, for tests/cluster only.

train.py builds `settings.ClusterSettings` in `main` and calls
cli/cluster_task.py. tests/cluster/test_distributed.py (not this
worktree's to change) still calls these three; delete this module once it
calls `cluster_task` with `cli.flags.read(settings.ClusterSettings)`.
"""

from __future__ import annotations

import os
from typing import Optional

from estimator_multigpu import cluster

from cli import cluster_task as cluster_task_lib
from cli import flags as cli_flags
from cli import settings

trainer_number = cluster_task_lib.trainer_number


def cluster_task() -> Optional[cluster.Task]:
  """This process's task from the cluster flags, else TF_CONFIG."""
  return cluster_task_lib.cluster_task(
      cli_flags.read(settings.ClusterSettings), os.environ.get("TF_CONFIG"))


def replicas_to_aggregate(task: Optional[cluster.Task]) -> int:
  """`cluster_task.replicas_to_aggregate` with --sync_replicas."""
  return cluster_task_lib.replicas_to_aggregate(
      task, cli_flags.read(settings.ClusterSettings).sync_replicas)
