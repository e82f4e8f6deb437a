"""Horovod as a system of `bench.cluster`: the peer run its own way.

Horovod 0.28.1 with gloo (no MPI), one process per TOWER (its documented
way: a task of 2 towers is 2 processes), `hvd.DistributedOptimizer` around
the unwrapped model_fn's optimizer, a plain Estimator per process and
`hvd.BroadcastGlobalVariablesHook(0)`, started by `horovodrun --gloo` on
localhost over `lo`. Every process trains on the per-tower batch (the
model's `bench.specs` batch / towers), so the global batch is the other
systems' (tasks × that batch). Horovod averages the gradients (each
process's loss is the mean over its batch; equal batches make that the
global mean); the loss it reports is each process's own, not the global
one ours reports every step.

Horovod is an optional extra of the benchmark (`pip install -e
".[bench-horovod]"` after building it, see docs/performance.md), never a
dependency of the package: without it, `available()` is False and
`bench.cluster` skips the system with one line.
"""

from __future__ import annotations

import importlib.util
import os
import sys

SYSTEM = "horovod"


def available() -> bool:
  """Whether this Python can run Horovod's TensorFlow binding."""
  return importlib.util.find_spec("horovod") is not None and os.path.exists(
      horovodrun())


def horovodrun() -> str:
  """The `horovodrun` next to this Python (its venv's)."""
  return os.path.join(os.path.dirname(sys.executable), "horovodrun")


def skip_line() -> str:
  """The one line `bench.cluster` prints when Horovod is missing."""
  return (f"horovod: skipped, Horovod is not installed for {sys.executable} "
          "(build it with gloo: docs/performance.md, 'Horovod as a "
          "system'); the other systems run.")


def launch_command(tasks: int, towers: int, task_command: list) -> list:
  """horovodrun starting `task_command` once per tower of every task."""
  processes = tasks * towers
  return [horovodrun(), "--gloo", "-np", str(processes), "-H",
          f"localhost:{processes}", "--network-interface", "lo",
          *task_command]


def record_path(out: str, rank: int) -> str:
  """Rank 0 writes `out` (the chief's record); rank r, worker<r-1>'s."""
  if rank == 0:
    return out
  return os.path.join(os.path.dirname(out), f"worker{rank - 1}.json")


def per_process_batch(global_batch_per_task: int, towers: int) -> int:
  """The batch of each of a task's `towers` processes.

  Raises:
    ValueError: the task's batch does not split evenly over its towers.
  """
  if global_batch_per_task % towers:
    raise ValueError(
        f"--towers={towers} does not divide the model's batch "
        f"{global_batch_per_task}; Horovod's processes need equal batches. "
        "Pick towers that divide it.")
  return global_batch_per_task // towers
