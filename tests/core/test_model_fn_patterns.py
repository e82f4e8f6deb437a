"""Round-3 model_fn patterns: a frozen backbone in replicated mode, a
loss-scale optimizer, the model_fn's own moving average."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
X, Y = harness.linear_data(7)


def two_layers(features):
  init = tf1.glorot_uniform_initializer
  with tf1.variable_scope("backbone"):
    h = tf1.layers.dense(features, 4, activation=tf.nn.tanh,
                         kernel_initializer=init(seed=1))
  with tf1.variable_scope("head"):
    return tf1.layers.dense(h, 2, kernel_initializer=init(seed=2))


def assert_same(one, many, atol=1e-5):
  for name, value in one.items():
    np.testing.assert_allclose(many[name], value, atol=atol, err_msg=name)


VAR_LISTS = {
    "scope": lambda: tf1.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES,
                                        scope="head"),
    "name_prefix": lambda: [v for v in tf1.trainable_variables()
                            if v.name.startswith("head/")],
    "exclude_prefix": lambda: [v for v in tf1.trainable_variables()
                               if not v.name.startswith("backbone/")],
}


@pytest.mark.parametrize("how", sorted(VAR_LISTS))
@pytest.mark.parametrize("num_towers", [2, 3])
def test_replicated_frozen_backbone(how, num_towers, session_config):
  def model_fn(features, labels, mode):
    loss = tf1.losses.mean_squared_error(labels, two_layers(features))
    opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.2, 0.9))
    train_op = opt.minimize(loss, tf1.train.get_global_step(),
                            var_list=VAR_LISTS[how]())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  one, _ = harness.train(model_fn, X, Y, 3, session_config)
  many, _ = harness.train(model_fn, X, Y, 3, session_config,
                          num_towers=num_towers, variable_update="replicated")
  assert_same(one, many)
  assert "backbone/dense/kernel/Momentum" not in many  # frozen: no slot.


def loss_scaled_model_fn(order):
  def model_fn(features, labels, mode):
    loss = tf1.losses.mean_squared_error(labels, two_layers(features))
    inner = tf1.train.GradientDescentOptimizer(0.1)
    scale = tf1.mixed_precision.DynamicLossScale(initial_loss_scale=2.0 ** 8)
    if order == "tower_outside":
      opt = emg.TowerOptimizer(
          tf1.mixed_precision.MixedPrecisionLossScaleOptimizer(inner, scale))
    else:
      opt = tf1.mixed_precision.MixedPrecisionLossScaleOptimizer(
          emg.TowerOptimizer(inner), scale)
    train_op = opt.minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn


@pytest.mark.parametrize("num_towers", [2, 3])
def test_tower_optimizer_around_a_loss_scale_optimizer(num_towers,
                                                       session_config):
  fn = loss_scaled_model_fn("tower_outside")
  one, _ = harness.train(fn, X, Y, 3, session_config)
  many, _ = harness.train(fn, X, Y, 3, session_config, num_towers=num_towers)
  assert_same(one, many)


def test_loss_scale_optimizer_around_tower_optimizer_is_a_clear_error(
    session_config):
  with pytest.raises(ValueError, match=r"TowerOptimizer\(MixedPrecisionLoss"):
    harness.train(loss_scaled_model_fn("tower_inside"), X, Y, 1,
                  session_config, num_towers=2)


@pytest.mark.parametrize("variable_update", ["shared", "replicated"])
@pytest.mark.parametrize("num_towers", [2, 3])
def test_the_model_fns_own_moving_average(num_towers, variable_update,
                                          session_config):
  """inception/NMT style: ema.apply after minimize, under its control."""
  def model_fn(features, labels, mode):
    loss = tf1.losses.mean_squared_error(labels, two_layers(features))
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.3))
    train_op = opt.minimize(loss, tf1.train.get_global_step())
    ema = tf1.train.ExponentialMovingAverage(0.5)
    with tf.control_dependencies([train_op]):
      train_op = ema.apply(tf1.trainable_variables())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  one, _ = harness.train(model_fn, X, Y, 3, session_config)
  many, _ = harness.train(model_fn, X, Y, 3, session_config,
                          num_towers=num_towers,
                          variable_update=variable_update)
  shadows = [name for name in one if name.endswith("ExponentialMovingAverage")]
  assert len(shadows) == 4  # one set: kernel and bias of both layers.
  assert sorted(n for n in many if "ExponentialMovingAverage" in n) == sorted(
      shadows)
  assert_same(one, many)


BATCH_NORMS = {
    "keras": lambda h, training: tf.keras.layers.BatchNormalization()(
        h, training=training),
    "tf1_layers": lambda h, training: tf1.layers.batch_normalization(
        h, training=training),
    "slim": lambda h, training: __import__("tf_slim").batch_norm(
        h, is_training=training),
}


@pytest.mark.parametrize("kind", sorted(BATCH_NORMS))
def test_batch_norm_without_sync_warns_once(kind, session_config,
                                            monkeypatch):
  from estimator_multigpu.cross_tower import sync_batch_norm  # pylint: disable=g-import-not-at-top
  warnings = []
  monkeypatch.setattr(sync_batch_norm.warn_once.logging, "warning",
                      lambda msg, *args: warnings.append(msg % args))

  def model_fn(features, labels, mode):
    h = BATCH_NORMS[kind](two_layers(features), mode == "train")
    loss = tf1.losses.mean_squared_error(labels, h)
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
    return tf.estimator.EstimatorSpec(
        mode, loss=loss,
        train_op=opt.minimize(loss, tf1.train.get_global_step()))

  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    harness.call(emg.multi_gpu(model_fn, devices=harness.cpu_devices(3)),
                 tf.constant(X), tf.constant(Y), "train", session_config)
  warnings = [w for w in warnings if "batch norm in training" in w]
  assert len(warnings) == 1 and "3 towers" in warnings[0]
