"""A ResNet from nets/ trains on 2 towers with `sync_batch_norm=True`."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness
import nets

tf1 = tf.compat.v1
pytestmark = pytest.mark.filterwarnings(
    "ignore:`layer.apply` is deprecated:UserWarning")
NUM_CLASSES = 5
MOVING_MEAN = "resnet_v1_50/conv1/BatchNorm/moving_mean"


def resnet_model_fn(features, labels, mode):
  training = mode == tf.estimator.ModeKeys.TRAIN
  network_fn = nets.get_network_fn("resnet_v1_50", NUM_CLASSES,
                                   is_training=training)
  logits, _ = network_fn(features)
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
  opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.01, 0.9))
  with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
    train_op = opt.minimize(loss, tf1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_resnet_v1_50_trains_on_two_synchronized_towers():
  rng = np.random.RandomState(0)
  images = rng.uniform(size=[4, 32, 32, 3]).astype(np.float32)
  labels = rng.randint(0, NUM_CLASSES, size=[4]).astype(np.int32)
  config = emg.make_session_config(num_cpus=2)
  with tf.Graph().as_default() as graph:
    tf1.train.get_or_create_global_step()
    fn = emg.multi_gpu(resnet_model_fn, devices=harness.cpu_devices(2),
                       sync_batch_norm=True)
    spec = harness.call(fn, tf.constant(images), tf.constant(labels),
                        tf.estimator.ModeKeys.TRAIN, config)
    moving_mean, = [v for v in tf1.global_variables()
                    if v.op.name == MOVING_MEAN]
    reduces = [op for op in graph.get_operations()
               if op.type == "CollectiveReduceV2"]
    with tf1.Session(config=config) as session:
      session.run(tf1.global_variables_initializer())
      before = session.run(moving_mean)
      losses = [session.run([spec.loss, spec.train_op])[0] for _ in range(2)]
      after = session.run(moving_mean)
  # 53 batch-norm layers x 2 towers x (forward + backward).
  assert len(reduces) == 53 * 2 * 2
  assert np.isfinite(losses).all()
  assert not np.allclose(before, after)
