"""Rows a model_fn selects from the batch or trims by a count of it, and
shapes that pass through ops on the global batch: one device's variables
on 2 and 3 towers, uneven batches and a batch smaller than the towers.

Each pattern in two spellings: a count rounded to an integer (Σᵢ int(xᵢ)
is not int(Σᵢ xᵢ): a rounding cast is not linear in a statistic), rows
chosen by their values through `tf.compat.v1.losses` (a mean over rows
counted by their values: not nᵢ/n of the towers' means), and a Dense
layer after a reshape of rows that an op on the global batch sliced back
(its inner axes must stay static, as on one device)."""

import pytest
import tensorflow as tf

import estimator_multigpu as emg

from tests import harness
from tests.global_batch import cases

tf1 = tf.compat.v1
STEPS = 2


def _head(x, units=3):
  return tf1.layers.dense(x, units, name="head",
                          kernel_initializer=tf1.glorot_uniform_initializer(7))


def _per_example(z1, labels):
  return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                        logits=_head(z1))


def trimmed_by_sort(z1, z2, labels):
  """The 80% smallest losses: a threshold at int(0.8·n) of the sorted batch."""
  del z2
  per = _per_example(z1, labels)
  n = tf.shape(per)[0]
  keep = tf.maximum(tf.cast(tf.cast(n, tf.float32) * 0.8, tf.int32), 1)
  mask = tf.cast(per <= tf.sort(per)[keep - 1], tf.float32)
  return tf.reduce_sum(per * mask) / tf.reduce_sum(mask)


def trimmed_by_top_k(z1, z2, labels):
  """The same idea with top_k of a floored count (tf.math.floor, int64)."""
  del z2
  per = _per_example(z1, labels)
  size = tf.cast(tf.size(per), tf.float32)
  keep = tf.cast(tf.maximum(tf.floor(size * 0.6), 1.0), tf.int64)
  smallest, _ = tf.math.top_k(-per, k=tf.cast(keep, tf.int32))
  return -tf.reduce_mean(smallest)


def where_rows_v1(z1, z2, labels):
  """tf.where indices, tf.gather, a v1 cross-entropy (its default mean)."""
  index = tf.where(labels > 0)[:, 0]
  logits = _head(tf.gather(z1, index))
  return tf1.losses.sparse_softmax_cross_entropy(
      tf.gather(labels, index), logits) + 0.01 * tf.reduce_mean(tf.square(z2))


def boolean_mask_v1(z1, z2, labels):
  """tf.boolean_mask, a weighted v1 mean squared error."""
  chosen = labels < 2
  return tf1.losses.mean_squared_error(
      tf.boolean_mask(z2, chosen), tf.boolean_mask(z1, chosen),
      weights=2.0, reduction=tf1.losses.Reduction.SUM_BY_NONZERO_WEIGHTS)


def rolled_then_dense(z1, z2, labels):
  """A Dense layer after tf.roll along the batch (an op on the global batch)
  and a reshape to [tf.shape(x)[0], -1]: its input's last axis is static."""
  rolled = tf.roll(tf.stack([z1, z2], 1), 1, 0)
  flat = tf.reshape(rolled, [tf.shape(rolled)[0], -1])
  return tf.reduce_mean(_per_example(flat, labels))


def reversed_then_flatten(z1, z2, labels):
  """tf.reverse along the batch, then tf.compat.v1.layers.flatten."""
  del z2
  rows = tf.reverse(tf.expand_dims(z1, 1), [0])
  return tf.reduce_mean(_per_example(tf1.layers.flatten(rows), labels))


def batch_norm_then_v1_loss(z1, z2, labels):
  """Batch norm by hand (tf.nn.moments, tf.nn.batch_normalization with
  variables), relu, a v1 cross-entropy: a tower with an empty shard must
  add nothing to the gradients (its moments are 0/0)."""
  del z2
  with tf1.variable_scope("bn"):
    gamma = tf1.get_variable("gamma", [4], initializer=tf1.ones_initializer())
    beta = tf1.get_variable("beta", [4], initializer=tf1.zeros_initializer())
  mean, variance = tf.nn.moments(z1, axes=[0])
  h = tf.nn.relu(tf.nn.batch_normalization(z1, mean, variance, beta, gamma,
                                           1e-3))
  return tf1.losses.sparse_softmax_cross_entropy(labels, _head(h))


LOSSES = {f.__name__: f for f in (
    trimmed_by_sort, trimmed_by_top_k, where_rows_v1, boolean_mask_v1,
    rolled_then_dense, reversed_then_flatten, batch_norm_then_v1_loss)}


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("towers,batch", [(2, 7), (3, 7), (3, 2)])
def test_one_device_variables(name, towers, batch, session_config):
  features, labels = cases.data(batch)
  want, want_loss = harness.train(cases.train_model_fn(LOSSES[name]),
                                  features, labels, STEPS, session_config)
  got, got_loss = harness.train(
      cases.train_model_fn(LOSSES[name], emg.TowerOptimizer), features,
      labels, STEPS, session_config, num_towers=towers)
  assert abs(got_loss - want_loss) < 1e-5, (got_loss, want_loss)
  harness.assert_same_variables(got, want)

