"""A tower's loss counted once by the towers' combination, whatever the
model_fn's normalization and `loss_reduction` say.

The towers' losses are combined as Σᵢ wᵢ·lossᵢ (wᵢ = nᵢ/n for "mean", 1 for
"sum"). A loss the global batch's rewrite made global (the same value in
every tower) counts once under "mean" but once per tower under "sum"; a sum
over the shard counts by its share under "mean". `tower_loss` makes each of
them the combination's kind, so every spelling below trains as one device
(2 and 3 towers, a batch of 7, uneven; 2 steps of plain SGD).
"""

import pytest
import tensorflow as tf

import estimator_multigpu as emg

from tests import harness

tf1 = tf.compat.v1
X, Y = harness.linear_data(7, seed=11)
INIT = tf1.constant_initializer([[0.5, -0.4], [0.3, 0.2], [-0.1, 0.6]])


def _squares(features, labels):
  w = tf1.get_variable("w", [3, 2], initializer=INIT)
  return tf.reduce_sum(tf.square(features @ w - labels), axis=1)


def mean_by_hand(features, labels):
  squares = _squares(features, labels)
  return tf.reduce_sum(squares) / tf.cast(tf.shape(squares)[0], tf.float32)


def mean_keras(features, labels):
  layer = tf.keras.layers.Dense(2, use_bias=False, kernel_initializer=INIT)
  return tf.keras.losses.MeanSquaredError()(labels, layer(features))


def summed(features, labels):
  return tf.reduce_sum(_squares(features, labels))


def summed_plus_decay(features, labels):
  loss = summed(features, labels)
  return loss + 0.1 * tf.add_n([tf.nn.l2_loss(v)
                                for v in tf1.trainable_variables()])


def log_of_sum(features, labels):
  """Nonlinear in the batch's sum: global by construction."""
  return tf.math.log1p(tf.reduce_sum(_squares(features, labels)))


def decay_only(features, labels):
  """A loss of the variables alone (with the shard's data unused but for a
  zero term): the same in every tower."""
  squares = _squares(features, labels)
  w = tf1.trainable_variables()[0]
  return 0.2 * tf.nn.l2_loss(w - 1.0) + 0.0 * tf.reduce_sum(squares)


LOSSES = {"mean_by_hand": mean_by_hand, "mean_keras": mean_keras,
          "summed": summed, "summed_plus_decay": summed_plus_decay,
          "log_of_sum": log_of_sum, "decay_only": decay_only}


def make_model_fn(loss_fn):
  def model_fn(features, labels, mode):
    loss = loss_fn(features, labels)
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.05))
    train_op = opt.minimize(loss, tf1.train.get_or_create_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("reduction,towers", [("sum", 2), ("sum", 3),
                                              ("mean", 3)])
def test_each_normalization_trains_as_one_device(name, reduction, towers,
                                                  session_config):
  fn = make_model_fn(LOSSES[name])
  want, want_loss = harness.train(fn, X, Y, 2, session_config)
  got, got_loss = harness.train(fn, X, Y, 2, session_config,
                                num_towers=towers, loss_reduction=reduction)
  assert abs(got_loss - want_loss) < 1e-5 * max(1.0, abs(want_loss))
  harness.assert_same_variables(got, want)
