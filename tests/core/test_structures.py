"""Inputs and model_fns of every shape train like one device.

Reference: the unwrapped model_fn trained on one device in plain TF, which
this library does not touch.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf
import tf_slim as slim

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
RNG = np.random.RandomState(3)
BATCH = 7


assert_same_variables = harness.assert_same_variables


def train_both(model_fn, features, labels, num_towers, session_config,
               steps=3, **options):
  want, want_loss = harness.train(model_fn, features, labels, steps,
                                  session_config)
  got, got_loss = harness.train(model_fn, features, labels, steps,
                                session_config, num_towers=num_towers,
                                **options)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
  return got, want


def momentum_train_op(loss):
  opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.1, 0.9))
  return opt.minimize(loss, tf1.train.get_global_step())


X = RNG.randn(BATCH, 3).astype(np.float32)
A = RNG.randn(BATCH, 1).astype(np.float32)
Y = RNG.randn(BATCH, 1).astype(np.float32)
SPARSE_INDICES = np.array([[0, 1], [0, 4], [2, 0], [3, 3], [5, 2], [6, 4]])
SPARSE_VALUES = RNG.randn(len(SPARSE_INDICES)).astype(np.float32)


def nested_features():
  return {"dense": tf.constant(X),
          "nested": {"pair": (tf.constant(A), tf.constant(2 * A))},
          "sparse": tf.SparseTensor(SPARSE_INDICES, SPARSE_VALUES,
                                    [BATCH, 5])}


def nested_model_fn(features, labels, mode):
  w = tf1.get_variable("w", [3, 1], initializer=tf1.ones_initializer())
  v = tf1.get_variable("v", [5, 1], initializer=tf1.ones_initializer())
  c = tf1.get_variable("c", [2], initializer=tf1.ones_initializer())
  a, b = features["nested"]["pair"]
  pred = (tf.matmul(features["dense"], w) + c[0] * a + c[1] * b +
          tf.sparse.sparse_dense_matmul(features["sparse"], v))
  loss = tf.reduce_mean(tf.square(pred - labels))
  return tf.estimator.EstimatorSpec(mode, loss=loss,
                                    train_op=momentum_train_op(loss))


@pytest.mark.parametrize("num_towers", [2, 3, 4])
def test_dict_nested_and_sparse_features(num_towers, session_config):
  got, want = train_both(nested_model_fn, nested_features, Y, num_towers,
                         session_config)
  assert_same_variables(got, want)


@pytest.mark.parametrize("num_towers", [2, 4])
def test_labels_none(num_towers, session_config):
  def model_fn(features, labels, mode):
    assert labels is None
    w = tf1.get_variable("w", [3, 1], initializer=tf1.ones_initializer())
    loss = tf.reduce_mean(tf.square(tf.matmul(features["x"], w) -
                                    features["y"]))
    return tf.estimator.EstimatorSpec(mode, loss=loss,
                                      train_op=momentum_train_op(loss))

  got, want = train_both(model_fn, {"x": X, "y": Y}, None, num_towers,
                         session_config)
  assert_same_variables(got, want)


IDS = RNG.randint(0, 10, size=(BATCH, 2)).astype(np.int64)


def embedding_model_fn(features, labels, mode):
  table = tf1.get_variable("embedding", [10, 4],
                           initializer=tf1.random_normal_initializer(seed=1))
  out = tf1.get_variable("out", [4, 1], initializer=tf1.ones_initializer())
  embedded = tf.reduce_mean(tf.nn.embedding_lookup(table, features), axis=1)
  loss = tf.reduce_mean(tf.square(tf.matmul(embedded, out) - labels))
  return tf.estimator.EstimatorSpec(mode, loss=loss,
                                    train_op=momentum_train_op(loss))


@pytest.mark.parametrize("num_towers", [2, 3])
def test_embedding_gradients_stay_sparse(num_towers, session_config):
  got, want = train_both(embedding_model_fn, IDS, Y, num_towers,
                         session_config)
  assert_same_variables(got, want)
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    fn = emg.multi_gpu(embedding_model_fn,
                       devices=harness.cpu_devices(num_towers))
    fn(tf.constant(IDS), tf.constant(Y), "train", {},
       harness.config_for(session_config))
    op_types = {op.type for op in tf1.get_default_graph().get_operations()}
  assert "ResourceSparseApplyMomentum" in op_types  # the embedding's update.


def test_variable_without_gradient_is_skipped_and_named(session_config,
                                                        caplog):
  def model_fn(features, labels, mode):
    w = tf1.get_variable("w", [3, 1], initializer=tf1.ones_initializer())
    tf1.get_variable("unused", [2], initializer=tf1.ones_initializer())
    loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
    return tf.estimator.EstimatorSpec(mode, loss=loss,
                                      train_op=momentum_train_op(loss))

  with caplog.at_level(logging.WARNING):
    got, want = train_both(model_fn, X, Y, 3, session_config)
  assert_same_variables(got, want)
  np.testing.assert_array_equal(got["unused"], [1.0, 1.0])
  assert "no gradient for 1 variable(s): unused" in caplog.text


def two_optimizers_model_fn(features, labels, mode):
  w1 = tf1.get_variable("w1", [3, 1], initializer=tf1.ones_initializer())
  w2 = tf1.get_variable("w2", [3, 1], initializer=tf1.ones_initializer())
  loss1 = tf.reduce_mean(tf.square(tf.matmul(features, w1) - labels))
  loss2 = tf.reduce_mean(tf.abs(tf.matmul(features, w2) + labels))
  opt1 = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
  opt2 = emg.TowerOptimizer(tf1.train.AdamOptimizer(0.05))
  train_op = tf.group(
      opt1.minimize(loss1, tf1.train.get_global_step(), var_list=[w1]),
      opt2.minimize(loss2, var_list=[w2]))
  return tf.estimator.EstimatorSpec(mode, loss=loss1 + loss2,
                                    train_op=train_op)


@pytest.mark.parametrize("num_towers", [2, 4])
def test_two_losses_two_optimizers(num_towers, session_config):
  got, want = train_both(two_optimizers_model_fn, X, Y, num_towers,
                         session_config)
  assert_same_variables(got, want)
  assert got["global_step"] == 3


def slim_model_fn(use_optimize_loss):
  def model_fn(features, labels, mode):
    hidden = slim.fully_connected(
        features, 4, weights_initializer=tf1.truncated_normal_initializer(
            seed=2), scope="hidden")
    pred = slim.fully_connected(hidden, 1, activation_fn=None,
                                weights_initializer=tf1.ones_initializer(),
                                scope="pred")
    loss = tf1.losses.mean_squared_error(labels, pred)
    total = tf1.losses.get_total_loss()
    opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.05, 0.9))
    if use_optimize_loss:
      train_op = slim.optimize_loss(total, tf1.train.get_global_step(),
                                    learning_rate=None, optimizer=opt,
                                    summaries=[])
    else:
      train_op = slim.learning.create_train_op(total, opt)
    del loss
    return tf.estimator.EstimatorSpec(mode, loss=total, train_op=train_op)
  return model_fn


@pytest.mark.parametrize("use_optimize_loss", [False, True])
def test_tf_slim_train_op_helpers(use_optimize_loss, session_config):
  got, want = train_both(slim_model_fn(use_optimize_loss), X, Y, 3,
                         session_config)
  assert_same_variables(got, want)


def keras_model_fn(features, labels, mode):
  init = tf.keras.initializers.GlorotUniform(seed=4)
  hidden = tf.keras.layers.Dense(4, activation="tanh",
                                 kernel_initializer=init)(features)
  pred = tf.keras.layers.Dense(1, kernel_initializer=init,
                               name="out")(hidden)
  loss = tf.reduce_mean(tf.square(pred - labels))
  return tf.estimator.EstimatorSpec(mode, loss=loss,
                                    train_op=momentum_train_op(loss))


@pytest.mark.parametrize("num_towers", [2, 4])
def test_keras_layers_create_no_duplicate_variables(num_towers,
                                                    session_config):
  got, want = train_both(keras_model_fn, X, Y, num_towers, session_config)
  assert sorted(got) == sorted(want) == [
      "dense/bias", "dense/bias/Momentum", "dense/kernel",
      "dense/kernel/Momentum", "global_step", "out/bias", "out/bias/Momentum",
      "out/kernel", "out/kernel/Momentum"]
  assert_same_variables(got, want)


def test_tf1_layers_share_variables(session_config):
  def model_fn(features, labels, mode):
    hidden = tf1.layers.dense(features, 4, kernel_initializer=(
        tf1.ones_initializer()))
    pred = tf1.layers.dense(hidden, 1, kernel_initializer=(
        tf1.glorot_uniform_initializer(seed=5)))  # op seeds need fixing.
    loss = tf.reduce_mean(tf.square(pred - labels))
    return tf.estimator.EstimatorSpec(mode, loss=loss,
                                      train_op=momentum_train_op(loss))

  got, want = train_both(model_fn, X, Y, 3, session_config)
  assert_same_variables(got, want)
