"""One task of a `bench.cluster` job: `python -m bench.cluster_task ...`.

`--system=ps`: the classic flags (`--ps_hosts`, `--worker_hosts`,
`--job_name`, `--task_index`; worker 0 is the chief); a ps serves until the
job ends, a trainer runs `multi_gpu` (shared variables) with
SyncReplicasOptimizer under `ps_job.run_trainer`, like
`tests/cluster/linear_cluster.py`. `--system=allreduce`: TF_CONFIG (chief +
workers), `multi_gpu(variable_update="replicated")` through
`emg.train_and_evaluate`, like `tests/cluster/all_reduce_task.py`.
`--system=mwms`: the peer, TensorFlow's `MultiWorkerMirroredStrategy` with
Estimator (`RunConfig(train_distribute=...)`, `tf.estimator.
train_and_evaluate`) on the unwrapped model_fn, one replica per task (the
`input_fn` batch is per task there, as ours). `--system=horovod`: one
process per tower under `horovodrun` (`bench.cluster_horovod`).

Every trainer trains `--model` on its own synthetic batch (the model's
`bench.specs` batch, split over `--towers` virtual CPUs) and writes
`--out`: the wall-clock time, global step, loopback bytes and the process's
CPU time after each step, and the trainable variables' bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

import estimator_multigpu as emg  # pylint: disable=wrong-import-position
from estimator_multigpu import cluster  # pylint: disable=wrong-import-position
from estimator_multigpu.cluster.ps import job as ps_job  # pylint: disable=wrong-import-position

from bench import cluster_horovod  # pylint: disable=wrong-import-position
from bench import cluster_trace  # pylint: disable=wrong-import-position
from bench import models  # pylint: disable=wrong-import-position
from bench import specs  # pylint: disable=wrong-import-position

tf1 = tf.compat.v1


def loopback_bytes() -> int:
  """Bytes sent on `lo` so far, by every process (/proc/net/dev)."""
  with open("/proc/net/dev") as dev:
    for line in dev:
      name, _, counters = line.partition(":")
      if name.strip() == "lo":
        return int(counters.split()[8])
  return 0


def cpu_seconds() -> float:
  """CPU time this process used so far, every thread, user + system."""
  times = os.times()
  return times.user + times.system


class StepRecorder(tf1.train.SessionRunHook):
  """Time, global step, loopback bytes and the process's CPU time after each
  step; JSON at the end
  (with `trace`'s summary of one step, if given)."""

  def __init__(self, path: str, trace: Optional[cluster_trace.StepTrace] = None):
    self._path, self._trace = path, trace
    self._record = {"times": [], "steps": [], "lo_bytes": [],
                    "cpu_seconds": [], "run_seconds": []}

  def begin(self):
    self._step = tf1.train.get_global_step()
    self._record["model_bytes"] = sum(
        v.shape.num_elements() * v.dtype.base_dtype.size
        for v in tf1.trainable_variables() if not v.name.startswith(
            "tower_"))

  def before_run(self, run_context):
    self._before = time.time()
    return tf1.train.SessionRunArgs(self._step)

  def after_run(self, run_context, run_values):
    self._record["times"].append(time.time())
    self._record["run_seconds"].append(time.time() - self._before)
    self._record["steps"].append(int(run_values.results) + 1)
    self._record["lo_bytes"].append(loopback_bytes())
    self._record["cpu_seconds"].append(cpu_seconds())

  def end(self, session):
    if self._trace is not None:
      self._record["trace"] = self._trace.summary
      self._record["timeline"] = self._trace.timeline
    with open(self._path, "w") as out:
      json.dump(self._record, out)


def recording_hooks(args) -> list:
  """The step recorder, and the step trace when `--trace_step` asks."""
  if not args.trace_step:
    return [StepRecorder(args.out)]
  trace = cluster_trace.StepTrace(args.trace_step)
  return [StepRecorder(args.out, trace), trace]


def make_model_fn(spec: specs.ModelSpec, replicas: int):
  """The bench model_fn; SyncReplicasOptimizer when `replicas` > 0."""
  def model_fn(features, labels, mode, config):
    loss = models.logits_and_loss(spec, features, labels)
    optimizer = models.make_optimizer()
    if replicas:
      optimizer = tf1.train.SyncReplicasOptimizer(optimizer, replicas,
                                                  replicas)
    optimizer = emg.TowerOptimizer(optimizer)
    train_op = optimizer.minimize(loss, tf1.train.get_global_step())
    hooks = ([optimizer.make_session_run_hook(config.is_chief, num_tokens=0)]
             if replicas else [])
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                      training_hooks=hooks)
  return model_fn


def run_config(model_dir: str, session_config) -> tf.estimator.RunConfig:
  """No checkpoints or summaries inside the timed steps."""
  return tf.estimator.RunConfig(
      model_dir=model_dir, save_checkpoints_steps=None,
      save_checkpoints_secs=None, save_summary_steps=0,
      log_step_count_steps=None, session_config=session_config)


def run_ps_system(args, spec: specs.ModelSpec) -> None:
  """A ps task or a synchronous trainer of a ps job."""
  task = cluster.resolve_task(args.ps_hosts, args.worker_hosts, args.job_name,
                              args.task_index, None)
  if task.type == cluster.PS:
    ps_job.serve_ps(task, linger_secs=10)
    return
  os.environ["TF_CONFIG"] = task.tf_config()
  base = emg.make_session_config(num_cpus=args.towers)
  model_fn = emg.multi_gpu(make_model_fn(spec, len(task.trainers)),
                           devices=towers(args))
  estimator = tf.estimator.Estimator(model_fn, config=run_config(
      args.model_dir, cluster.session_config(task, base)))
  recorders = recording_hooks(args)
  ps_job.run_trainer(
      task, lambda hooks: estimator.train(
          models.make_input_fn(spec, spec.global_batch_size),
          max_steps=args.steps, hooks=recorders + hooks),
      sync_replicas=True, base_config=base, ps_wait_secs=60)


def run_allreduce_system(args, spec: specs.ModelSpec) -> None:
  """A chief or worker of an all-reduce job (TF_CONFIG)."""
  model_fn = emg.multi_gpu(make_model_fn(spec, 0), devices=towers(args))
  estimator = tf.estimator.Estimator(model_fn, config=run_config(
      args.model_dir, emg.make_session_config(num_cpus=args.towers)))
  input_fn = models.make_input_fn(spec, spec.global_batch_size)
  emg.train_and_evaluate(
      estimator, tf.estimator.TrainSpec(input_fn, max_steps=args.steps,
                                        hooks=recording_hooks(args)),
      tf.estimator.EvalSpec(input_fn, steps=1), peer_timeout_secs=60)


def run_mwms_system(args, spec: specs.ModelSpec) -> None:
  """A chief or worker of MultiWorkerMirroredStrategy + Estimator."""
  # Graph mode throughout (as Estimator): an eager strategy would start its
  # own server, or place its copies on devices the eager context lacks.
  tf1.disable_eager_execution()
  strategy = tf1.distribute.experimental.MultiWorkerMirroredStrategy()
  config = tf.estimator.RunConfig(  # as `run_config`, with the strategy.
      model_dir=args.model_dir, save_checkpoints_steps=None,
      save_checkpoints_secs=None, save_summary_steps=0,
      log_step_count_steps=None, train_distribute=strategy)

  def model_fn(features, labels, mode):
    loss = models.logits_and_loss(spec, features, labels)
    train_op = models.make_optimizer().minimize(
        loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  input_fn = models.make_input_fn(spec, spec.global_batch_size)
  tf.estimator.train_and_evaluate(
      tf.estimator.Estimator(model_fn, config=config),
      tf.estimator.TrainSpec(input_fn, max_steps=args.steps,
                             hooks=recording_hooks(args)),
      tf.estimator.EvalSpec(input_fn, steps=1))


def run_horovod_system(args, spec: specs.ModelSpec) -> None:
  """One process (one tower) of a Horovod job (`bench.cluster_horovod`)."""
  import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
  hvd.init()
  tf1.disable_eager_execution()  # Estimator's graph mode, as the others.
  batch = cluster_horovod.per_process_batch(spec.global_batch_size,
                                            args.towers)

  def model_fn(features, labels, mode):
    loss = models.logits_and_loss(spec, features, labels)
    optimizer = hvd.DistributedOptimizer(models.make_optimizer())
    train_op = optimizer.minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  args.out = cluster_horovod.record_path(args.out, hvd.rank())
  model_dir = os.path.join(args.model_dir, f"rank{hvd.rank()}")
  estimator = tf.estimator.Estimator(model_fn,
                                     config=run_config(model_dir, None))
  estimator.train(models.make_input_fn(spec, batch), max_steps=args.steps,
                  hooks=[hvd.BroadcastGlobalVariablesHook(0)] +
                  recording_hooks(args))


SYSTEMS = {"ps": run_ps_system, "allreduce": run_allreduce_system,
           "mwms": run_mwms_system,
           cluster_horovod.SYSTEM: run_horovod_system}


def towers(args) -> list:
  return [f"/cpu:{i}" for i in range(args.towers)]


def parse(argv):
  parser = argparse.ArgumentParser()
  parser.add_argument("--system", choices=sorted(SYSTEMS), required=True)
  parser.add_argument("--model", default="mlp", choices=sorted(specs.MODELS))
  parser.add_argument("--towers", type=int, default=1)
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--out", required=True)
  for name in ("ps_hosts", "worker_hosts"):
    parser.add_argument(f"--{name}", type=lambda text: text.split(","))
  parser.add_argument("--trace_step", type=int, default=0,
                      help="Trace this step (1-based; 0: none).")
  parser.add_argument("--job_name")
  parser.add_argument("--task_index", type=int, default=0)
  return parser.parse_args(argv)


def main(argv) -> None:
  status = 0
  try:
    args = parse(argv)
    tf.get_logger().setLevel("ERROR")
    SYSTEMS[args.system](args, specs.get_model(args.model))
  except Exception:  # pylint: disable=broad-except
    traceback.print_exc()
    status = 1
  cluster.exit_process(status)


if __name__ == "__main__":
  main(sys.argv[1:])
