"""The graph side of an all-reduce job: its tasks, and collectives between them.

An all-reduce job (a chief and workers, no ps; `cluster.all_reduce`) runs
the same graph on every task; all the towers of all the tasks form one
collective group. This module holds what that graph needs:

- `AllReduceCluster`: the job's training tasks and which one this is,
  recognised from the RunConfig Estimator made of TF_CONFIG, and the devices
  of its collective groups.
- `sum_over_tasks`: a value summed over the tasks (the global batch's
  example count, the loss); `once_per_session` computes one at session start.
- `broadcast_scaffold`: at session start every task receives the chief's
  variables (a collective broadcast, no shared file system needed), so the
  replicas start, and stay, equal.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import tensorflow as tf

from estimator_multigpu import collectives
from estimator_multigpu import compat
from estimator_multigpu.graph import dataflow

tf1 = tf.compat.v1

CHIEF, WORKER, PS = "chief", "worker", "ps"


@dataclasses.dataclass(frozen=True)
class AllReduceCluster:
  """The training tasks of an all-reduce job, and which one this is.

  Attributes:
    cluster: TF_CONFIG's cluster ({"chief": [...], "worker": [...]}).
    task_type: "chief" or "worker".
    task_index: the task's index in its job.
  """
  cluster: dict
  task_type: str
  task_index: int

  @classmethod
  def from_run_config(cls, config: Any) -> Optional["AllReduceCluster"]:
    """The all-reduce cluster a RunConfig describes, or None (no cluster, a
    chief alone, a ps cluster, or an evaluator)."""
    spec = getattr(config, "cluster_spec", None)
    jobs = spec.as_dict() if spec is not None else {}
    if PS in jobs or CHIEF not in jobs or not jobs.get(WORKER) or (
        getattr(config, "task_type", None) not in (CHIEF, WORKER)):
      return None
    return cls({job: list(hosts) for job, hosts in jobs.items()
                if job in (CHIEF, WORKER)},
               config.task_type, config.task_id)

  @property
  def tasks(self) -> list:
    """Every training task's device prefix, in task order."""
    return ([f"/job:{CHIEF}/replica:0/task:0"] +
            [f"/job:{WORKER}/replica:0/task:{i}"
             for i in range(len(self.cluster.get(WORKER, [])))])

  @property
  def position(self) -> int:
    """This task's place in `tasks` (the chief is 0)."""
    return 0 if self.task_type == CHIEF else 1 + self.task_index

  @property
  def is_chief(self) -> bool:
    return self.task_type == CHIEF

  @property
  def leader(self) -> str:
    return self.tasks[0]

  def qualify(self, device: str, position: Optional[int] = None) -> str:
    """`device` (`/device:CPU:1`) on task `position` (default: this one)."""
    task = self.tasks[self.position if position is None else position]
    return tf.DeviceSpec.from_string(task).make_merged_spec(
        tf.DeviceSpec.from_string(device)).to_string()

  def group_devices(self, devices: list) -> list:
    """Every task's towers, in task order (each task has `devices`)."""
    return [self.qualify(d, p) for p in range(len(self.tasks))
            for d in devices]

  def task_group(self, device: str) -> collectives.Group:
    """One member per task, on `device` of each (its first tower)."""
    return collectives.Group(
        tuple(self.qualify(device, p) for p in range(len(self.tasks))),
        first_local=self.position, local_towers=1)


def sum_over_tasks(value: tf.Tensor, cluster: AllReduceCluster,
                   device: str) -> tf.Tensor:
  """Σ over the tasks of `value` (computed once per task, on `device`)."""
  group = cluster.task_group(device)
  return collectives.all_reduce_sum(value, group, cluster.position,
                                    group.devices[cluster.position])


def once_per_session(value: tf.Tensor) -> tf.Tensor:
  """`value` computed once, when the session starts, and read every step.

  A local variable initialized from `value`: Estimator runs the local
  initializers on every task before its first step (`broadcast_scaffold`'s
  `local_init_op`), so a collective inside `value` runs there once, not per
  step.
  """
  variable = tf1.Variable(value, trainable=False, name="once_per_session",
                          collections=[tf1.GraphKeys.LOCAL_VARIABLES])
  return tf.identity(variable)


def broadcast_scaffold(scaffold: Optional[tf1.train.Scaffold],
                       cluster: AllReduceCluster,
                       device: str) -> tf1.train.Scaffold:
  """The spec's scaffold; every task starts from the chief's variables.

  Its `local_init_op` (which Estimator's session creators run after the
  chief's restore or initialization, and on the other tasks instead of
  waiting for someone to initialize their variables) initializes a worker's
  own variables, then sets every global variable to the chief's value (a sum
  over the tasks in which only the chief contributes), then initializes the
  local variables (the towers' replicated copies read tower 0's).
  """
  scaffold = scaffold or tf1.train.Scaffold()
  variables = tf1.global_variables()
  with tf.name_scope("from_chief/"):
    before = ([] if cluster.is_chief else
              [tf1.variables_initializer(variables)])
    with tf.control_dependencies(before):
      received = tf.group(*[_receive(v, cluster, device) for v in variables])
    _after(received, tf1.local_variables())
    local_init = tf.group(received, tf1.local_variables_initializer(),
                          tf1.tables_initializer(), name="local_init")
  return tf1.train.Scaffold(
      ready_op=tf.constant([], tf.string),
      ready_for_local_init_op=tf.constant([], tf.string),
      local_init_op=local_init, copy_from_scaffold=scaffold)


def _after(received: tf.Operation, local_variables: list) -> None:
  """A local variable whose initial value reads a global one (a tower's
  replicated copy reads tower 0's) reads it after the chief's value came."""
  for variable in local_variables:
    source = getattr(variable, "initial_value", None)
    if source is None or source.op.type != "Identity":
      continue
    reads = [t.op for t in source.op.inputs
             if t.op.type in dataflow.VARIABLE_READS]
    for op in reads or [source.op]:
      compat.private(op, "_add_control_inputs")([received])


def _receive(variable, cluster: AllReduceCluster, device: str):
  """Assigns the chief's value of `variable` to this task's."""
  value = variable.read_value() if hasattr(variable, "read_value") else (
      tf.identity(variable))
  mine = value if cluster.is_chief else tf.zeros_like(value)
  if mine.dtype == tf.bool:
    mine = tf.cast(mine, tf.int32)
  with tf.device(cluster.qualify(device)):
    chief = tf.stop_gradient(sum_over_tasks(mine, cluster, device))
  return variable.assign(tf.cast(chief, variable.dtype.base_dtype)).op
