"""One task of an all-reduce job on loopback, for test_all_reduce_cluster.py.

Every task reads TF_CONFIG, trains `model_fn` on `--towers` virtual CPU
towers with the default `variable_update` ("auto": replicated in a cluster)
through `emg.train_and_evaluate`, on its own rows `--rows=a:b` of the
7-example global batch, and exits. `--batch_norm` adds a batch-norm layer
with `sync_batch_norm=True` (moments over every task's towers).

    TF_CONFIG=... python tests/cluster/all_reduce_task.py --towers=2 \\
        --rows=0:4 --model_dir=/tmp/chief --steps=3
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu.runtime import hooks

tf1 = tf.compat.v1
BATCH = 7


def data():
  rng = np.random.RandomState(0)
  return (rng.randn(BATCH, 3).astype(np.float32),
          rng.randn(BATCH, 2).astype(np.float32))


def model_fn(features, labels, mode, batch_norm=False):
  """Two dense layers (batch norm between them), Momentum."""
  init = tf1.glorot_uniform_initializer
  h = tf1.layers.dense(features, 4, tf.nn.tanh, name="hidden",
                       kernel_initializer=init(seed=1))
  if batch_norm:
    h = tf1.layers.batch_normalization(h, training=True, name="norm")
  pred = tf1.layers.dense(h, 2, name="out", kernel_initializer=init(seed=2))
  loss = tf1.losses.mean_squared_error(labels, pred)
  opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.2, 0.9))
  with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
    train_op = opt.minimize(loss, tf1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def parse(argv):
  parser = argparse.ArgumentParser()
  parser.add_argument("--towers", type=int, default=1)
  parser.add_argument("--rows", default="0:7")
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--peer_timeout_secs", type=float, default=120.0)
  parser.add_argument("--accumulate_steps", type=int, default=1)
  parser.add_argument("--ema_decay", type=float, default=None)
  parser.add_argument("--all_reduce", default=None)
  parser.add_argument("--batch_norm", type=int, default=0)
  # 1: the loss of every step to <model_dir>_losses.json.
  parser.add_argument("--record_losses", type=int, default=0)
  # Faults and slow phases (test_all_reduce_faults.py).
  parser.add_argument("--build_delay_secs", type=float, default=0)
  parser.add_argument("--pause_at_step", type=int, default=-1)
  parser.add_argument("--pause_secs", type=float, default=0)
  parser.add_argument("--stuck_at_step", type=int, default=-1)
  return parser.parse_args(argv)


class RecordLoss(tf1.train.SessionRunHook):
  """Writes the loss the spec reports at every step to a JSON list."""

  def __init__(self, loss, path):
    self._loss, self._path, self._values = loss, path, []

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs(self._loss)

  def after_run(self, run_context, run_values):
    self._values.append(float(run_values.results))

  def end(self, session):
    with open(self._path, "w") as out:
      json.dump(self._values, out)


class Pause(tf1.train.SessionRunHook):
  """Sleeps between two steps, as a long save or evaluation would."""

  def __init__(self, step, secs):
    self._step, self._secs, self._steps = step, secs, 0

  def after_run(self, run_context, run_values):
    self._steps += 1
    if self._steps == self._step:
      time.sleep(self._secs)


def slow(model_fn, secs):
  """`model_fn` after `secs` of sleep: a graph that takes long to build."""
  def build(features, labels, mode):
    time.sleep(secs)
    return model_fn(features, labels, mode)
  return build


def stuck_at(dataset, step):
  """The input hangs in the `step`-th batch (1-based) of this task."""
  if step < 1:
    return dataset
  counter = {"batches": 0}

  def count(x):
    counter["batches"] += 1
    while counter["batches"] == step:
      time.sleep(1)
    return x

  return dataset.map(lambda x, y: (tf.numpy_function(
      count, [x], tf.float32, stateful=True), y)).map(
          lambda x, y: (tf.ensure_shape(x, [None, 3]), y))


def main(argv):
  args = parse(argv)
  start, end = (int(v) for v in args.rows.split(":"))
  x, y = data()
  config = tf.estimator.RunConfig(
      model_dir=args.model_dir, tf_random_seed=1,
      session_config=emg.make_session_config(num_cpus=args.towers),
      save_checkpoints_steps=args.steps, log_step_count_steps=1)
  fn = emg.multi_gpu(
      slow(lambda features, labels, mode: model_fn(features, labels, mode,
                                                   bool(args.batch_norm)),
           args.build_delay_secs),
      devices=[f"/cpu:{i}" for i in range(args.towers)],
      accumulate_steps=args.accumulate_steps, ema_decay=args.ema_decay,
      all_reduce=args.all_reduce, sync_batch_norm=bool(args.batch_norm))
  if args.record_losses:
    fn = hooks.with_training_hooks(fn, lambda spec: [
        RecordLoss(spec.loss, f"{args.model_dir}_losses.json")])
  input_fn = lambda: stuck_at(tf.data.Dataset.from_tensors(  # noqa: E731
      (x[start:end], y[start:end])).repeat(), args.stuck_at_step)
  emg.train_and_evaluate(
      tf.estimator.Estimator(fn, config=config),
      tf.estimator.TrainSpec(input_fn, max_steps=args.steps, hooks=[
          Pause(args.pause_at_step, args.pause_secs)]),
      tf.estimator.EvalSpec(input_fn, steps=1),
      peer_timeout_secs=args.peer_timeout_secs)


if __name__ == "__main__":
  main(sys.argv[1:])
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0)  # pylint: disable=protected-access
