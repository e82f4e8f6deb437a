"""The benchmarked models: one single-device model_fn, one tower loss.

Every system trains the same network on the same synthetic data with the same
optimizer (momentum SGD); only the way it is spread over devices differs.
"""

from __future__ import annotations

import tensorflow as tf

import estimator_multigpu as emg

from bench.specs import ModelSpec
import datasets
import nets

tf1 = tf.compat.v1
ModeKeys = tf.estimator.ModeKeys


def logits_and_loss(spec: ModelSpec, images, labels):
  """The network's mean cross-entropy on one batch (or one shard)."""
  kwargs = {"hidden_units": spec.hidden_units} if spec.hidden_units else {}
  network_fn = nets.get_network_fn(spec.net_name, spec.num_classes,
                                   is_training=True)
  logits, _ = network_fn(images, **kwargs)
  return tf1.losses.sparse_softmax_cross_entropy(labels, logits)


def make_optimizer() -> tf1.train.Optimizer:
  return tf1.train.MomentumOptimizer(0.01, 0.9)


def make_model_fn(spec: ModelSpec, tower_optimizer: bool):
  """An ordinary Estimator model_fn (TRAIN only) for `spec`.

  Args:
    spec: the model.
    tower_optimizer: wrap the optimizer in `TowerOptimizer` (for `multi_gpu`);
      False gives the unwrapped model_fn a user would write for one device.
  """

  def model_fn(features, labels, mode):
    if mode != ModeKeys.TRAIN:
      raise ValueError(f"The benchmark's model_fn only trains; got {mode}.")
    loss = logits_and_loss(spec, features, labels)
    optimizer = make_optimizer()
    if tower_optimizer:
      optimizer = emg.TowerOptimizer(optimizer)
    with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
      train_op = optimizer.minimize(loss, tf1.train.get_or_create_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  return model_fn


def make_input_fn(spec: ModelSpec, batch_size: int):
  """Synthetic images: one cached batch handed out again and again."""
  return lambda: datasets.get_dataset(
      "synthetic", "train", batch_size, image_size=spec.image_size,
      channels=spec.channels, num_classes=spec.num_classes)
