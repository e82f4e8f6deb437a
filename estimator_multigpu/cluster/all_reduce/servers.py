"""All-reduce between machines: a chief and workers, no parameter server.

Horovod's, tf_cnn_benchmarks' `collective_all_reduce` and
MultiWorkerMirroredStrategy's way to scale past one machine, in graph mode
with Estimator: every task (the chief, worker 0, worker 1, ...) runs the same
program on its own `input_fn` batch, keeps its own replicated copies of the
variables (`variable_update="replicated"`), and all the towers of all the
tasks form one collective group (`CollectiveReduceV2`: NCCL inside a machine,
a ring between machines). So a step applies the gradient of the *global*
batch, every task's batch in task order, weighted by examples.

- `cross_tower.across_tasks` holds the graph side: `AllReduceCluster`
  recognises such a cluster from the RunConfig Estimator made of TF_CONFIG
  (a `chief`, `worker` tasks, no `ps`); the chief restores or initializes the
  variables and saves checkpoints under the single-device names, and at
  session start every task receives the chief's values
  (`broadcast_scaffold`), so the replicas start, and stay, equal.
- `server_config` is what each task's server must offer: the towers' devices
  (Estimator's own server start keeps only the GPU options, so a CPU host's
  virtual devices would vanish) and the collective group leader.

`train_and_evaluate` (in `cluster.all_reduce.training`) starts the server and
runs the task; `cluster.all_reduce.peer_probe` ends a task whose peer is gone.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from estimator_multigpu import strategies
from estimator_multigpu.cross_tower.across_tasks import AllReduceCluster

tf1 = tf.compat.v1

# Bytes per piece of a tensor a server hands another task (`RecvBuf`).
# TensorFlow's default, 4 KiB, makes ~1,800 protobuf strings per 7.45 MB of
# gradients; one piece (-1) makes allocations above glibc's mmap threshold
# (128 KiB), page-faulted afresh every step. 64 KiB: fewer allocations, all
# from the heap; measured here, 2-8 % less CPU per step across tasks
# (docs/performance.md, "Where the time goes").
RECV_BUF_CHUNK_BYTES = 64 << 10


def server_config(cluster: AllReduceCluster,
                  base: Optional[tf1.ConfigProto]) -> tf1.ConfigProto:
  """`base` (its device count) plus the collective group leader, and
  `RECV_BUF_CHUNK_BYTES` unless `base` sets its own chunk size."""
  config = tf1.ConfigProto()
  if base is not None:
    config.CopyFrom(base)
  del config.device_filters[:]
  config.experimental.collective_group_leader = cluster.leader
  if not config.experimental.recv_buf_max_chunk:
    config.experimental.recv_buf_max_chunk = RECV_BUF_CHUNK_BYTES
  return config


def variable_update_in_job(variable_update: str) -> str:
  """What `variable_update` is across the tasks of an all-reduce job:
  "auto" is what the strategy registry picks there (replicated); any other
  value is itself (a bad one is refused where it is checked)."""
  try:
    return strategies.choose(variable_update, "sync",
                             replicate=True).variable_update
  except ValueError:
    return variable_update
