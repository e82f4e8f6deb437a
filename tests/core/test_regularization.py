"""Regularization counts once, like one device, under every loss_reduction.

Every tower's loss adds the same regularization term r (it depends on the
variables only); the towers' losses are combined with weights wᵢ (nᵢ/n for
"mean", 1 for "sum"), so r would count Σwᵢ times: once for "mean", once per
tower for "sum". Each spelling below trains 2 steps on 2 and 3 towers (a
batch of 7: uneven) and compares every variable with one device.
"""

import pytest
import tensorflow as tf

import estimator_multigpu as emg

from tests import harness

tf1 = tf.compat.v1
X, Y = harness.linear_data(7, seed=3)
INIT = tf1.constant_initializer([[0.5, -0.4], [0.3, 0.2], [-0.1, 0.6]])


def l2_regularizer(scale):
  """tf.contrib.layers.l2_regularizer, as TF 1.x had it."""
  return lambda weights: scale * tf.nn.l2_loss(weights)


def _data_loss(labels, pred, reduction):
  squares = tf.reduce_sum(tf.square(pred - labels), axis=1)
  return tf.reduce_mean(squares) if reduction == "mean" else tf.reduce_sum(
      squares)


def _layers_loss(features, labels, reduction):
  """tf.compat.v1.layers with a contrib-style regularizer;
  get_regularization_loss()."""
  pred = tf1.layers.dense(features, 2, name="lin", kernel_initializer=INIT,
                          kernel_regularizer=l2_regularizer(0.3))
  return (_data_loss(labels, pred, reduction) +
          tf1.losses.get_regularization_loss())


def _get_variable_loss(features, labels, reduction):
  """get_variable(regularizer=...); tf.compat.v1.losses.get_total_loss()."""
  w = tf1.get_variable("w", [3, 2], initializer=INIT, regularizer=l2_regularizer(0.2))
  b = tf1.get_variable("b", [2], initializer=tf1.zeros_initializer(),
                       regularizer=lambda v: 0.1 * tf.reduce_sum(tf.abs(v)))
  tf1.losses.add_loss(_data_loss(labels, features @ w + b, reduction))
  return tf1.losses.get_total_loss()


def _keras_loss(features, labels, reduction):
  """A Keras layer's regularizer, read from its `losses`."""
  layer = tf.keras.layers.Dense(
      2, name="lin", kernel_initializer=INIT, kernel_regularizer=tf.keras.regularizers.l2(0.25))
  pred = layer(features)
  return _data_loss(labels, pred, reduction) + tf.add_n(layer.losses)


def _added_loss(features, labels, reduction):
  """A weight decay by hand, added to REGULARIZATION_LOSSES and read back."""
  w = tf1.get_variable("w", [3, 2], initializer=INIT)
  decay = 0.15 * tf.add_n([tf.nn.l2_loss(v)
                           for v in tf1.trainable_variables()])
  tf1.losses.add_loss(decay, tf1.GraphKeys.REGULARIZATION_LOSSES)
  return (_data_loss(labels, features @ w, reduction) +
          tf1.losses.get_regularization_loss())


def _activity_loss(features, labels, reduction):
  """An activity regularizer (a term of the shard's own values) of a
  tf.compat.v1.layers layer, with a weight regularizer; get_total_loss()."""
  pred = tf1.layers.dense(
      features, 2, name="lin", kernel_initializer=INIT,
      kernel_regularizer=l2_regularizer(0.3),
      activity_regularizer=lambda out: 0.05 * tf.reduce_sum(tf.square(out)))
  tf1.losses.add_loss(_data_loss(labels, pred, reduction))
  return tf1.losses.get_total_loss()


def _by_hand_loss(features, labels, reduction):
  """A weight decay written by hand, added to the loss directly: a uniform
  term of every tower's loss, counted by the tower's share of it."""
  w = tf1.get_variable("w", [3, 2], initializer=INIT)
  decay = 0.15 * tf.add_n([tf.nn.l2_loss(v)
                           for v in tf1.trainable_variables()])
  return _data_loss(labels, features @ w, reduction) + decay


SPELLINGS = {"layers": _layers_loss, "get_variable": _get_variable_loss,
             "keras": _keras_loss, "added": _added_loss,
             "activity": _activity_loss, "by_hand": _by_hand_loss}


def make_model_fn(loss_fn, reduction):
  def model_fn(features, labels, mode):
    loss = loss_fn(features, labels, reduction)
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.05))
    train_op = opt.minimize(loss, tf1.train.get_or_create_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
@pytest.mark.parametrize("reduction,towers,variable_update", [
    ("sum", 2, "shared"), ("sum", 3, "replicated"), ("mean", 3, "shared"),
    ("mean", 2, "replicated")])
def test_regularization_counts_once(spelling, reduction, towers,
                                    variable_update, session_config, caplog):
  fn = make_model_fn(SPELLINGS[spelling], reduction)
  want, want_loss = harness.train(fn, X, Y, 2, session_config)
  got, got_loss = harness.train(fn, X, Y, 2, session_config,
                                num_towers=towers, loss_reduction=reduction,
                                variable_update=variable_update)
  assert abs(got_loss - want_loss) < 1e-5 * max(1.0, abs(want_loss))
  harness.assert_same_variables(got, want)
  assert not [r for r in caplog.records if "REGULARIZATION_LOSSES" in
              r.getMessage()]


@pytest.mark.parametrize("loss_fn,warned", [(_by_hand_loss, True),
                                            (_layers_loss, False),
                                            (_keras_loss, False)])
def test_without_the_global_batch_a_decay_by_hand_under_sum_warns(
    loss_fn, warned, session_config, caplog):
  # global_batch=False: tower 0's weight terms count alone, and a term of
  # the loss computed from the variables only, not among them, is warned.
  with tf.Graph().as_default():
    harness.call(emg.multi_gpu(make_model_fn(loss_fn, "sum"),
                               devices=harness.cpu_devices(2),
                               loss_reduction="sum", global_batch=False),
                 tf.constant(X), tf.constant(Y),
                 tf.estimator.ModeKeys.TRAIN, session_config)
  messages = [r.getMessage() for r in caplog.records
              if "REGULARIZATION_LOSSES" in r.getMessage()]
  assert bool(messages) == warned, messages
