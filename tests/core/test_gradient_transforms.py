"""Per-tower transforms of the gradients are found from the graph's
structure, whatever their ops are named (clip by norm, by global norm, by
value), and warned about once; linear scaling is exact and silent."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu.update import clipping

import harness

tf1 = tf.compat.v1
X, Y = harness.linear_data(7)


def transformed_model_fn(transform, use_compute_gradients):
  def model_fn(features, labels, mode):
    pred = tf1.layers.dense(features, 2, name="lin",
                            kernel_initializer=tf1.ones_initializer())
    loss = tf1.losses.mean_squared_error(labels, pred)
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
    if use_compute_gradients:
      grads_and_vars = opt.compute_gradients(loss)
      grads, tvars = zip(*grads_and_vars)
    else:
      tvars = tf1.trainable_variables()
      grads = tf.gradients(loss, tvars)
    train_op = opt.apply_gradients(zip(transform(list(grads)), tvars),
                                   tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn


TRANSFORMS = {
    "global_norm_renamed": lambda g: tf.clip_by_global_norm(
        g, 0.05, name="grad_clip")[0],
    "per_variable_norm": lambda g: [tf.clip_by_norm(t, 0.05) for t in g],
    "by_value": lambda g: [tf.clip_by_value(t, -0.01, 0.01) for t in g],
}


def built_names(model_fn, session_config):
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    harness.call(emg.multi_gpu(model_fn, devices=harness.cpu_devices(2)),
                 tf.constant(X), tf.constant(Y), "train", session_config)
    return sorted(set(tf1.get_collection(clipping.TRANSFORMED_COLLECTION)))


@pytest.mark.parametrize("use_compute_gradients", [True, False])
@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_nonlinear_transforms_are_found_and_warned_once(
    name, use_compute_gradients, session_config, monkeypatch):
  warnings = []
  monkeypatch.setattr(clipping.warn_once.logging, "warning",
                      lambda msg, *args: warnings.append(msg % args))
  fn = transformed_model_fn(TRANSFORMS[name], use_compute_gradients)
  assert built_names(fn, session_config) == ["lin/bias", "lin/kernel"]
  assert len(warnings) == 1  # once, not once per tower.
  assert "clip_gradients_by_norm=" in warnings[0]


@pytest.mark.parametrize("use_compute_gradients", [True, False])
def test_scaling_by_a_constant_is_exact_and_silent(use_compute_gradients,
                                                   session_config):
  fn = transformed_model_fn(lambda g: [t * 0.5 for t in g],
                            use_compute_gradients)
  assert built_names(fn, session_config) == []
  one, _ = harness.train(fn, X, Y, 2, session_config)
  many, _ = harness.train(fn, X, Y, 2, session_config, num_towers=3)
  for name, value in one.items():
    np.testing.assert_allclose(many[name], value, atol=1e-6, err_msg=name)


def _minimized(mode, loss):
  """The TRAIN spec minimizing `loss` by SGD."""
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
  return tf.estimator.EstimatorSpec(
      mode, loss=loss, train_op=opt.minimize(loss,
                                             tf1.train.get_global_step()))


def test_backpropagation_through_where_and_abs_is_not_a_transform(
    session_config):
  def model_fn(features, labels, mode):
    w = tf1.get_variable("w", [3, 2])
    safe = tf.where(tf.math.is_finite(w), w, tf.zeros_like(w))
    pred = tf.matmul(features, safe) + tf.reduce_sum(tf.abs(w))
    return _minimized(mode, tf1.losses.mean_squared_error(labels, pred))
  assert built_names(model_fn, session_config) == []


def test_a_gradient_of_partly_unknown_static_shape_is_not_a_transform(
    session_config):
  """A Dense over a rank-4 input of unknown batch size (a tower's shard):
  its [1, 1] kernel's gradient is a MatMul of static shape [None, 1]. It
  is the gradient, not a factor scaling it (which, reading the batch norm's
  Rsqrt on the walk of gamma's gradient, was taken for a norm)."""
  def dense(h, units):
    return tf1.layers.dense(h, units, kernel_initializer=(
        tf1.glorot_uniform_initializer(seed=1)))

  def model_fn(features, labels, mode):
    h = tf1.layers.batch_normalization(dense(features, 4), training=True)
    h = dense(tf.reshape(h, [-1, 2, 2, 1]), 1)
    pred = dense(tf.reshape(h, [-1, 4]), 2)
    return _minimized(mode, tf1.losses.mean_squared_error(labels, pred))
  assert built_names(model_fn, session_config) == []
  want, _ = harness.train(model_fn, X, Y, 2, session_config)
  got, _ = harness.train(model_fn, X, Y, 2, session_config, num_towers=3,
                         dynamic_batch=True, sync_batch_norm=True)
  # The trained variables (the moving averages are batch norm's tests').
  trained = [name for name in want if "moving_" not in name]
  harness.assert_same_variables({k: got[k] for k in trained},
                                {k: want[k] for k in trained})
