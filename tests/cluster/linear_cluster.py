"""A linear model trained on a cluster, for tests/test_distributed.py.

Trainer k (the chief is 0, worker i of the flags is i) always reads its own
fixed shard `shard(k)` as its global batch, so the weights after N
synchronous steps are known in closed form (`expected`). Each trainer runs
it on 2 virtual CPU towers with an exponential moving average.

    python tests/cluster/linear_cluster.py --ps_hosts=localhost:2222 \\
        --worker_hosts=localhost:2223,localhost:2224 --job_name=worker \\
        --task_index=1 --model_dir=/tmp/linear --max_steps=20 --sync_replicas

argparse, not absl flags: the tests import this module next to train.py.
"""

import argparse
import os
import sys
import traceback

import numpy as np
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu import cluster
from estimator_multigpu.cluster.ps import job as ps_job

tf1 = tf.compat.v1
W0 = np.full((3, 2), 0.5, np.float32)
LEARNING_RATE = 0.1
EMA_DECAY = 0.5
BATCH = 8


def shard(trainer: int) -> tuple:
  """Trainer `trainer`'s fixed (features, labels)."""
  rng = np.random.RandomState(100 + trainer)
  return (rng.randn(BATCH, 3).astype(np.float32),
          rng.randn(BATCH, 2).astype(np.float32))


def gradient(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """d/dw of mean((x w - y)^2) over all entries."""
  return 2.0 * x.T @ (x @ w - y) / y.size


def expected(num_trainers: int, steps: int) -> tuple:
  """Weights and moving average after `steps` synchronous SGD steps.

  Each step averages the trainers' gradients at the same weights; then the
  average moves with decay min(EMA_DECAY, (1 + t) / (10 + t)) at step t.
  """
  w = W0.astype(np.float64)
  shadow = w.copy()
  for step in range(1, steps + 1):
    grads = [gradient(w, *shard(k)) for k in range(num_trainers)]
    w = w - LEARNING_RATE * np.mean(grads, axis=0)
    decay = min(EMA_DECAY, (1.0 + step) / (10.0 + step))
    shadow = decay * shadow + (1 - decay) * w
  return w, shadow


def model_fn(features, labels, mode, params, config):
  w = tf1.get_variable("w", initializer=W0)
  loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
  optimizer = tf1.train.GradientDescentOptimizer(LEARNING_RATE)
  replicas = params["replicas"]
  if replicas:
    optimizer = tf1.train.SyncReplicasOptimizer(optimizer, replicas, replicas)
  optimizer = emg.TowerOptimizer(optimizer)
  train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  hooks = ([optimizer.make_session_run_hook(config.is_chief, num_tokens=0)]
           if replicas else [])
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                    training_hooks=hooks)


def parse_args(argv):
  parser = argparse.ArgumentParser()
  for name in ("ps_hosts", "worker_hosts"):
    parser.add_argument(f"--{name}", type=lambda text: text.split(","))
  parser.add_argument("--job_name")
  parser.add_argument("--task_index", type=int, default=0)
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--max_steps", type=int, default=20)
  parser.add_argument("--sync_replicas", action="store_true")
  parser.add_argument("--ps_wait_secs", type=float, default=60)
  return parser.parse_args(argv)


def run(args) -> int:
  task = cluster.resolve_task(args.ps_hosts, args.worker_hosts, args.job_name,
                              args.task_index, os.environ.get("TF_CONFIG"))
  if task.type == cluster.PS:
    ps_job.serve_ps(task, linger_secs=30)
    return 0
  os.environ["TF_CONFIG"] = task.tf_config()
  base = emg.make_session_config(num_cpus=2)
  estimator = tf.estimator.Estimator(
      emg.multi_gpu(model_fn, devices=["/cpu:0", "/cpu:1"],
                    ema_decay=EMA_DECAY),
      params={"replicas": len(task.trainers) if args.sync_replicas else 0},
      config=tf.estimator.RunConfig(
          model_dir=args.model_dir, save_checkpoints_steps=1000,
          session_config=cluster.session_config(task, base)))
  trainer = 0 if task.is_chief else task.index + 1
  input_fn = lambda: tf.data.Dataset.from_tensors(shard(trainer)).repeat()
  ps_job.run_trainer(
      task, lambda hooks: estimator.train(input_fn, max_steps=args.max_steps,
                                          hooks=hooks),
      sync_replicas=args.sync_replicas, base_config=base,
      ps_wait_secs=args.ps_wait_secs)
  return 0


def main(argv) -> None:
  try:
    status = run(parse_args(argv))
  except Exception:  # pylint: disable=broad-except
    traceback.print_exc()
    status = 1
  cluster.exit_process(status)


if __name__ == "__main__":
  main(sys.argv[1:])
