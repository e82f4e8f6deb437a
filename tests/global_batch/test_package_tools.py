"""The package's own normalizers meeting values the rewrite already made
the global batch's: each counts them once.

`emg.global_ratio(numerator, denominator)` sums the towers' denominators,
and `tf.compat.v1.losses` inside the towers (`cross_tower.v1_losses`) divide
by the global batch's count through it. When the rewrite has already made
an argument the global batch's value (Object Detection's
`tf.maximum(num_matches, 1.0)`: a statistic meeting a constant, computed
with the global count; a loss of per-example values a coupling gathered,
an RNN state sized by `params["batch_size"]`), that argument is the same
in every tower and is one device's value: summed again, it counted each
example once per tower. Every case below trains as one device (2 and 3
towers, a batch of 7, uneven, and of 2, smaller than 3 towers; either
`loss_reduction`).
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

from tests import harness

tf1 = tf.compat.v1
STEPS = 2
INIT = tf1.constant_initializer([[0.5, -0.4], [0.3, 0.2], [-0.1, 0.6]])
# Positive anchors: with 3 towers some shard has none (its count is 0).
POSITIVES = {7: [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0], 2: [0.0, 1.0]}
GRID = [(2, 7), (3, 7), (2, 2), (3, 2)]


def _data(batch, in_dim=3, out_dim=2):
  x, y = harness.linear_data(batch, in_dim, out_dim, seed=17)
  return {"x": x, "pos": np.array(POSITIVES[batch], np.float32)}, y


def _detection_terms(features, labels):
  """(per-anchor losses, positives, a per-example mean): OD's shapes."""
  w = tf1.get_variable("w", [3, 2], initializer=INIT)
  per_anchor = tf.reduce_sum(tf.square(features["x"] @ w - labels), axis=1)
  mean = tf.reduce_mean(tf.abs(features["x"] @ w))
  return per_anchor, features["pos"], mean


def ratio_of_count(features, labels):
  per_anchor, pos, mean = _detection_terms(features, labels)
  return emg.global_ratio(tf.reduce_sum(per_anchor * pos),
                          tf.reduce_sum(pos)) + mean


def ratio_of_clipped_count(features, labels):
  """object_detection's normalize_loss_by_num_matches: the count clipped
  at 1 (a statistic meeting a constant: the rewrite makes it global)."""
  per_anchor, pos, mean = _detection_terms(features, labels)
  num_matches = tf.reduce_sum(pos)
  return emg.global_ratio(tf.reduce_sum(per_anchor * pos),
                          tf.maximum(num_matches, 1.0)) + 2.0 * mean


def ratio_of_nonlinear_sum(features, labels):
  """A numerator nonlinear in the batch's sum (global by the rewrite)."""
  per_anchor, pos, mean = _detection_terms(features, labels)
  return emg.global_ratio(tf.math.log1p(tf.reduce_sum(per_anchor * pos)),
                          tf.maximum(tf.reduce_sum(pos), 1.0)) + mean


def v1_loss_in_batch(features, labels):
  """In-batch softmax (a similarity matrix of the batch: global) through a
  tf.compat.v1.losses reduction, which normalizes over the global batch."""
  del labels
  w = tf1.get_variable("w", [3, 2], initializer=INIT)
  q = features["x"] @ w
  logits = tf.matmul(q, tf.tanh(q), transpose_b=True)
  return tf1.losses.sparse_softmax_cross_entropy(
      tf.range(tf.shape(logits)[0]), logits)


def v1_sum_in_batch(features, labels):
  """The same with Reduction.SUM (`tower_share` of a global sum)."""
  del labels
  w = tf1.get_variable("w", [3, 2], initializer=INIT)
  q = features["x"] @ w
  logits = tf.matmul(q, tf.tanh(q), transpose_b=True)
  per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(
      tf.range(tf.shape(logits)[0]), logits)
  return 0.1 * tf1.losses.compute_weighted_loss(
      per_example, reduction=tf1.losses.Reduction.SUM)


LOSSES = {"ratio_of_count": ratio_of_count,
          "ratio_of_clipped_count": ratio_of_clipped_count,
          "ratio_of_nonlinear_sum": ratio_of_nonlinear_sum,
          "v1_loss_in_batch": v1_loss_in_batch,
          "v1_sum_in_batch": v1_sum_in_batch}


def _model_fn(loss_fn, wrapped):
  def model_fn(features, labels, mode):
    loss = loss_fn(features, labels)
    sgd = tf1.train.GradientDescentOptimizer(0.1)
    opt = emg.TowerOptimizer(sgd) if wrapped else sgd
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
        loss, tf1.train.get_or_create_global_step()))
  return model_fn


def _assert_one_device(model_fn_of, features, labels, towers, reduction,
                       session_config, params=None):
  want, want_loss = harness.train(model_fn_of(False), features, labels,
                                  STEPS, session_config, params=params)
  got, got_loss = harness.train(model_fn_of(True), features, labels, STEPS,
                                session_config, num_towers=towers,
                                params=params, loss_reduction=reduction)
  assert abs(got_loss - want_loss) < 1e-5 * max(1.0, abs(want_loss)), (
      got_loss, want_loss)
  harness.assert_same_variables(got, want)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("towers,batch", GRID)
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_normalizers_count_global_values_once(name, towers, batch,
                                              reduction, session_config):
  features, labels = _data(batch)
  _assert_one_device(lambda wrapped: _model_fn(LOSSES[name], wrapped),
                     features, labels, towers, reduction, session_config)


def _rnn_model_fn(wrapped):
  """TPU-era RNN code: the state sized by params["batch_size"] (the global
  batch), a tf.compat.v1.losses mean of the last output."""
  def model_fn(features, labels, mode, params):
    tf1.get_variable_scope().set_initializer(
        tf1.glorot_uniform_initializer(seed=7))
    cell = tf1.nn.rnn_cell.BasicRNNCell(4)
    state = cell.zero_state(params["batch_size"], tf.float32)
    for t in range(3):
      with tf1.variable_scope("rnn", reuse=t > 0):
        out, state = cell(features[:, 2 * t:2 * t + 2], state)
    pred = tf1.layers.dense(out, 1, name="out")
    loss = tf1.losses.mean_squared_error(labels, pred)
    sgd = tf1.train.GradientDescentOptimizer(0.1)
    opt = emg.TowerOptimizer(sgd) if wrapped else sgd
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
        loss, tf1.train.get_or_create_global_step()))
  return model_fn


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("towers,batch", GRID)
def test_zero_state_sized_by_params_batch_size(towers, batch, reduction,
                                               session_config):
  x, y = harness.linear_data(batch, 6, 1, seed=23)
  _assert_one_device(_rnn_model_fn, x, y, towers, reduction, session_config,
                     params={"batch_size": batch})
