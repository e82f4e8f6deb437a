"""The systems under test, each training one `specs.ModelSpec` at one global batch.

- `single`: the unwrapped model_fn in a plain Estimator (the baseline).
- `multi_gpu`: the model_fn wrapped by `estimator_multigpu.multi_gpu`
  (shared variables, tf_cnn_benchmarks' `parameter_server`).
- `replicated`: the same with `variable_update="replicated"` (a copy per
  tower, collective all-reduce; tf_cnn_benchmarks' `replicated`).
- `multi_gpu_sync_bn`: the same with `sync_batch_norm=True` (batch-norm
  models only): what synchronized batch norm costs, side by side.
- `mirrored`: the unwrapped model_fn under `tf.distribute.MirroredStrategy`
  through `RunConfig(train_distribute=...)`; its input_fn yields the
  per-replica batch (global / replicas), so the global batch is the same.
- `tutorial`: the CIFAR-10 multi-GPU tutorial's hand-written tower loop
  (per-tower loss, `tf.gradients`, average by expand_dims/concat/reduce_mean,
  apply once) in a plain `tf.compat.v1.Session` loop.
- `split`: the same loop with every tower on the first device: what cutting
  the batch into N shards and summing N gradients costs by itself, the floor
  under any data-parallel wrapper when the towers share the same cores.
"""

from __future__ import annotations

import tempfile

import tensorflow as tf

import estimator_multigpu as emg

from bench import models
from bench import protocol
from bench import specs

tf1 = tf.compat.v1
SYSTEMS = ("single", "multi_gpu", "replicated", "multi_gpu_sync_bn",
           "mirrored", "tutorial", "split")


def tower_devices(kind: str, num_towers: int) -> list:
  """`/cpu:0..` (virtual CPUs) or `/gpu:0..`, one per tower."""
  return [f"/{kind}:{k}" for k in range(num_towers)]


def session_config(job: dict) -> tf1.ConfigProto:
  """Our session config: one virtual CPU per tower (on CPU), optionally
  with explicit intra-op / inter-op thread pool sizes."""
  config = emg.make_session_config(
      num_cpus=job["towers"] if job["kind"] == "cpu" else 1)
  config.intra_op_parallelism_threads = job.get("intra_op", 0)
  config.inter_op_parallelism_threads = job.get("inter_op", 0)
  return config


def _run_config(**kwargs) -> tf.estimator.RunConfig:
  """No checkpoints, summaries or step logging inside the timed loop."""
  return tf.estimator.RunConfig(
      model_dir=tempfile.mkdtemp(prefix="bench_"), save_checkpoints_steps=None,
      save_checkpoints_secs=None, save_summary_steps=0,
      log_step_count_steps=None, **kwargs)


def make_estimator(spec: specs.ModelSpec, job: dict) -> tuple:
  """The Estimator of an Estimator-based system and its input batch size."""
  devices = tower_devices(job["kind"], job["towers"])
  if job["system"] == "single":
    return tf.estimator.Estimator(models.make_model_fn(spec, False),
                                  config=_run_config()), spec.global_batch_size
  if job["system"] in ("multi_gpu", "replicated", "multi_gpu_sync_bn"):
    model_fn = emg.multi_gpu(
        models.make_model_fn(spec, True), devices=devices,
        variable_update=("replicated" if job["system"] == "replicated"
                         else "shared"),
        sync_batch_norm=job["system"] == "multi_gpu_sync_bn")
    return tf.estimator.Estimator(model_fn, config=_run_config(
        session_config=session_config(job))), spec.global_batch_size
  strategy = tf.distribute.MirroredStrategy(
      devices, cross_device_ops=_cross_device_ops(job["kind"]))
  return tf.estimator.Estimator(
      models.make_model_fn(spec, False),
      config=_run_config(train_distribute=strategy)), (
          spec.global_batch_size // job["towers"])


def _cross_device_ops(kind: str):
  """NCCL on GPUs. On virtual CPUs the default hangs in Estimator's first
  step (observed with TF 2.15), so reduce to one device there."""
  return (tf.distribute.NcclAllReduce() if kind == "gpu"
          else tf.distribute.ReductionToOneDevice())


def run_estimator(spec: specs.ModelSpec, job: dict,
                  pacer: protocol.Pacer) -> None:
  estimator, batch_size = make_estimator(spec, job)
  estimator.train(models.make_input_fn(spec, batch_size),
                  hooks=[protocol.PacedHook(pacer)])


def average_gradients(tower_grads: list) -> list:
  """The tutorial's average: expand_dims, concat, reduce_mean per variable."""
  averaged = []
  for grads_and_vars in zip(*tower_grads):
    grads = [tf.expand_dims(g, 0) for g, _ in grads_and_vars]
    grad = tf.reduce_mean(tf.concat(grads, axis=0), axis=0)
    averaged.append((grad, grads_and_vars[0][1]))
  return averaged


def _variables_on_cpu(device: str):
  """The tutorial's placement: variables on the CPU, other ops on `device`."""
  return lambda op: "/cpu:0" if op.type in ("VariableV2", "VarHandleOp") else (
      device)


def build_tutorial_graph(spec: specs.ModelSpec, devices: list) -> tf.Operation:
  """Towers share variables (on the CPU) through `reuse_variables()`; tower
  0's BN updates run with the step. Returns the train op."""
  global_step = tf1.train.get_or_create_global_step()
  dataset = models.make_input_fn(spec, spec.global_batch_size)()
  images, labels = tf1.data.make_one_shot_iterator(dataset).get_next()
  shards = zip(tf.split(images, len(devices)), tf.split(labels, len(devices)))
  optimizer, tower_grads = models.make_optimizer(), []
  with tf1.variable_scope(tf1.get_variable_scope()):
    for index, (device, (x, y)) in enumerate(zip(devices, shards)):
      with tf1.device(_variables_on_cpu(device)), \
          tf1.name_scope(f"tower_{index}"):
        loss = models.logits_and_loss(spec, x, y)
        tf1.get_variable_scope().reuse_variables()
        variables = tf1.trainable_variables()
        tower_grads.append(list(zip(tf.gradients(loss, variables), variables)))
  with tf.device("/cpu:0"):
    grads = average_gradients(tower_grads)
  update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, scope="tower_0")
  with tf.control_dependencies(update_ops):
    return optimizer.apply_gradients(grads, global_step)


def run_tutorial(spec: specs.ModelSpec, job: dict,
                 pacer: protocol.Pacer) -> None:
  """The `tutorial` system, or with `job["system"] == "split"` the `split`."""
  devices = tower_devices(job["kind"], job["towers"])
  if job["system"] == "split":
    devices = devices[:1] * job["towers"]
  with tf.Graph().as_default():
    train_op = build_tutorial_graph(spec, devices)
    tf1.add_to_collection(tf1.GraphKeys.TRAIN_OP, train_op)
    pacer.graph = train_op.graph
    with tf1.Session(config=session_config(job)) as session:
      session.run(tf1.global_variables_initializer())
      running = True
      while running:
        session.run(train_op)
        running = pacer.step_done()
