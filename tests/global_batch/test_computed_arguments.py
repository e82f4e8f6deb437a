"""Ops the table knows stay per shard however their arguments are computed:
`tf.slice` of the whole batch with begin and size built from the shard's
shape, as `tf.estimator.MultiHead` splits its logits (`-1 * ones_like(
shape[:-1])`, a `tf.concat` of it), gathers nothing and trains as one
device on 2 and 3 towers (contract 24: speed is kept)."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

from tests import harness
from tests.global_batch import cases

tf1 = tf.compat.v1
TRAIN = tf.estimator.ModeKeys.TRAIN


def split_logits(logits, sizes):
  """`MultiHead._split_logits` (tensorflow_estimator 2.15), verbatim."""
  batch_shape = tf1.shape(logits)[:-1]
  zeros_like_batch_shape = tf1.zeros_like(batch_shape)
  minus_ones_like_batch_shape = -1 * tf1.ones_like(batch_shape)
  begin_idx, parts = 0, []
  for size in sizes:
    begin_tensor = tf.concat([zeros_like_batch_shape, [begin_idx]], axis=0)
    size_tensor = tf.concat([minus_ones_like_batch_shape, [size]], axis=0)
    parts.append(tf.slice(logits, begin=begin_tensor, size=size_tensor))
    begin_idx += size
  return parts


def model_fn(features, labels, mode):
  head_a, head_b = split_logits(cases.encoder(features["v1"]), [1, 3])
  labels = tf.cast(labels[:, None], tf.float32)
  loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
      labels=tf.minimum(labels, 1.0), logits=head_a)) + tf.reduce_mean(
          tf.square(head_b - labels))
  optimizer = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.2, 0.9))
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=(
      optimizer.minimize(loss, tf1.train.get_global_step())))


@pytest.mark.parametrize("towers,batch", [(2, 7), (3, 7), (3, 2)])
def test_split_logits_stay_per_shard(towers, batch, session_config):
  features, labels = cases.data(batch)
  want, _ = harness.train(model_fn, features, labels, 3, session_config)
  got, _ = harness.train(model_fn, features, labels, 3, session_config,
                         num_towers=towers)
  harness.assert_same_variables(got, want)
  with tf.Graph().as_default() as graph:
    tf1.train.get_or_create_global_step()
    fn = emg.multi_gpu(model_fn, devices=harness.cpu_devices(towers))
    harness.call(fn, tf.nest.map_structure(tf.constant, features),
                 tf.constant(labels), TRAIN, session_config)
  assert emg.global_batch_ops(graph) == []


def test_split_logits_reference_is_the_heads():
  """The helper splits as written: columns [0:1] and [1:4] (numpy)."""
  logits = np.arange(8, dtype=np.float32).reshape(2, 4)
  with tf.Graph().as_default(), tf1.Session() as session:
    a, b = session.run(split_logits(tf.constant(logits), [1, 3]))
  np.testing.assert_array_equal(a, logits[:, :1])
  np.testing.assert_array_equal(b, logits[:, 1:])
