"""Several machines: ps tasks hold the variables, workers run the towers.

A cluster has parameter-server (ps) tasks, a chief (worker 0, which also
initializes, checkpoints and writes summaries), more workers, and optionally
an evaluator outside the cluster. Estimator wraps the model_fn in
`replica_device_setter`: variables go to the ps tasks (round robin), every
other op to the worker. `multi_gpu`'s tower device function sits inside it
and adds the worker's local device, so tower i of worker k runs on
`/job:worker/task:k/device:GPU:i`, and each worker sums its towers' gradients
on its aggregation device before one copy per variable goes to the ps.

This module: which task this process runs and how its server starts.
  - `Task`: the task, from the classic flags (worker 0 becomes TF_CONFIG's
    `chief`, worker i > 0 becomes `worker` i - 1) or from a ready TF_CONFIG.
  - `start_server`: the task's server, exposing the towers' devices (Estimator
    starts it with the GPU options only, so virtual CPU towers would vanish).
  - `session_config`: device filters, so a trainer sees the ps tasks and
    itself only.
  - `exit_process`: a task's process can hang in TensorFlow's teardown of
    its server; tasks flush their files, release the model dir's lock and
    leave at once.
The evaluator task runs `estimator_multigpu.runtime.evaluation.evaluate_checkpoints`,
the loop eval.py runs too.

How a job starts and ends (waiting for the ps and the chief, reporting to
the ps, `SyncReplicasOptimizer`'s shutdown) is `cluster.ps.job`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional, Sequence

from absl import logging
import tensorflow as tf

from estimator_multigpu.runtime import process_exit

tf1 = tf.compat.v1

PS, CHIEF, WORKER, EVALUATOR = "ps", "chief", "worker", "evaluator"
TASK_TYPES = (PS, CHIEF, WORKER, EVALUATOR)


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
    return list(self.cluster.get(PS, []))

  @property
  def all_reduce(self) -> bool:
    """A cluster without ps: the trainers all-reduce (`cluster.all_reduce`)."""
    return not self.cluster.get(PS)

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
    if not hosts and (name == "worker_hosts" or len(worker_hosts or []) < 2):
      raise ValueError(
          f"--{name} is empty; a cluster needs at least one ps and one worker "
          "address, e.g. --ps_hosts=ps0:2222 --worker_hosts=w0:2222,w1:2222, "
          "the same on every task (or, with no ps, two or more workers that "
          "all-reduce, --variable_update=auto or replicated).")
  if job_name not in (PS, WORKER, EVALUATOR):
    raise ValueError(f"--job_name is {job_name!r}; expected ps, worker or "
                     "evaluator (worker 0 is the chief).")
  cluster = {PS: list(ps_hosts)} if ps_hosts else {}
  cluster[CHIEF] = [worker_hosts[0]]
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

  An `evaluator` job in the cluster (Kubeflow's TFJob lists it) is dropped:
  the evaluator is not part of the training cluster.

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
    _check_not_sparse(config)
    return None
  task = config.get("task") or {}
  return check_task(Task(training_cluster(config["cluster"]),
                         task.get("type"), int(task.get("index", 0))))


def _check_not_sparse(config: dict) -> None:
  """Raises for a TFJob's sparse TF_CONFIG, which is not a local run."""
  if config.get("sparseCluster"):
    raise ValueError(
        "TF_CONFIG has a `sparseCluster` and no `cluster` (a Kubeflow TFJob "
        "with enableDynamicWorker: true); every task here needs the whole "
        "cluster (the chief's address, all ps): set enableDynamicWorker: "
        "false.")


def training_cluster(cluster: dict) -> dict:
  """`cluster` as job -> address list, without its `evaluator` job.

  Raises:
    ValueError: it lists more than one evaluator.
  """
  evaluators = list(cluster.get(EVALUATOR, []))
  if len(evaluators) > 1:
    raise ValueError(
        f"The cluster lists {len(evaluators)} evaluators ({evaluators}); "
        "expected at most one: each would evaluate every checkpoint into "
        "the same model_dir/eval. Keep one (TFJob: Evaluator replicas: 1).")
  return {job: list(hosts) for job, hosts in cluster.items()
          if job != EVALUATOR}


def check_task(task: Task) -> Task:
  """Checks that `task` is a ps/chief/worker cluster task or an evaluator."""
  unknown = sorted(set(task.cluster) - {PS, CHIEF, WORKER})
  if unknown or len(task.cluster.get(CHIEF, [])) != 1 or not (
      task.cluster.get(PS) or task.cluster.get(WORKER)):
    raise ValueError(
        f"The cluster has jobs {sorted(task.cluster)} with "
        f"{len(task.cluster.get(CHIEF, []))} chief(s) and "
        f"{len(task.cluster.get(PS, []))} ps; expected exactly one chief, at "
        "least one ps and optionally workers, or a chief and workers without "
        "ps (an all-reduce job, --variable_update=replicated) (a TFJob needs "
        "a Chief replica spec with replicas: 1; rename a `master` job to "
        "`chief`; a chief alone: train on one machine instead).")
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
  if task.type in (CHIEF, WORKER) and not task.all_reduce:
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


def exit_process(status: int) -> None:
  """Flushes summaries and logs, releases the model dir's lock, then ends
  the process at once.

  A process with a gRPC server can take tens of seconds, or forever, in
  TensorFlow's C++ teardown at a normal exit (clean server shutdown is not
  implemented), so cluster tasks leave through `os._exit`
  (`runtime.process_exit.exit_now`).
  """
  process_exit.exit_now(status)
