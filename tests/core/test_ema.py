"""Exponential moving average of the weights: numpy recurrence and its use.

numpy reference: SGD on linear regression gives w_t after step t; the shadow
starts at w_0 and after step t (global step t) becomes
d_t·shadow + (1 - d_t)·w_t with d_t = min(decay, (1 + t) / (10 + t)).
With decay 0.3: d_1 = 2/11, d_2 = 3/12 = 0.25, then 0.3 from t = 3 on.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
X, Y = harness.linear_data(6, out_dim=1, seed=11)
W0 = np.array([[0.2], [-0.4], [0.6]], np.float32)
LR, DECAY, STEPS = 0.2, 0.3, 5


def model_fn(features, labels, mode):
  w = tf1.get_variable("w", initializer=W0)
  pred = tf.matmul(features, w)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions=pred)
  loss = tf.reduce_mean(tf.square(pred - labels))
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(LR))
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
      loss, tf1.train.get_global_step()))


def numpy_weights_and_shadow(steps=STEPS):
  w = W0.astype(np.float64)
  shadow = w.copy()
  for t in range(1, steps + 1):
    w = w - LR * 2.0 / len(X) * X.T @ (X @ w - Y)
    decay = min(DECAY, (1.0 + t) / (10.0 + t))
    shadow = decay * shadow + (1 - decay) * w
  return w, shadow


@pytest.mark.parametrize("variable_update", ["shared", "replicated"])
@pytest.mark.parametrize("num_towers", [1, 3])
def test_shadow_follows_the_recurrence(num_towers, variable_update,
                                       session_config):
  values, _ = harness.train(model_fn, X, Y, STEPS, session_config,
                            num_towers=num_towers, ema_decay=DECAY,
                            variable_update=variable_update)
  w, shadow = numpy_weights_and_shadow()
  np.testing.assert_allclose(values["w"], w, atol=1e-6)
  np.testing.assert_allclose(values["w/ExponentialMovingAverage"], shadow,
                             atol=1e-6)


def input_fn():
  return tf.data.Dataset.from_tensors((X, Y)).repeat()


def eval_input_fn():
  return tf.data.Dataset.from_tensors((X, Y))


def trained(tmp_path, session_config, **options):
  estimator = tf.estimator.Estimator(
      emg.multi_gpu(model_fn, devices=["/cpu:0", "/cpu:1"], ema_decay=DECAY,
                    **options),
      config=tf.estimator.RunConfig(str(tmp_path),
                                    session_config=session_config))
  estimator.train(input_fn, max_steps=STEPS)
  return estimator


@pytest.mark.parametrize("variable_update", ["shared", "replicated"])
@pytest.mark.parametrize("use_ema_weights", [True, False])
def test_eval_and_predict_use_the_averaged_weights(use_ema_weights,
                                                   variable_update, tmp_path,
                                                   session_config):
  estimator = trained(tmp_path, session_config,
                      use_ema_weights=use_ema_weights,
                      variable_update=variable_update)
  w, shadow = numpy_weights_and_shadow()
  weights = shadow if use_ema_weights else w
  loss = estimator.evaluate(eval_input_fn)["loss"]
  np.testing.assert_allclose(loss, np.mean((X @ weights - Y) ** 2),
                             rtol=1e-5)
  predictions = np.stack(list(estimator.predict(
      lambda: tf.data.Dataset.from_tensors(X))))
  np.testing.assert_allclose(predictions, X @ weights, atol=1e-5)
  # The raw variable itself is untouched by the averaged-weight saver.
  np.testing.assert_allclose(estimator.get_variable_value("w"), w, atol=1e-6)


def test_ema_checkpoint_evaluates_with_the_unwrapped_model_fn(
    tmp_path, session_config):
  trained(tmp_path, session_config)
  plain = tf.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(
      str(tmp_path), session_config=session_config))
  w, _ = numpy_weights_and_shadow()
  np.testing.assert_allclose(plain.evaluate(eval_input_fn)["loss"],
                             np.mean((X @ w - Y) ** 2), rtol=1e-5)


def test_batch_norm_statistics_are_averaged_too(session_config):
  def bn_model_fn(features, labels, mode):
    features = tf1.layers.batch_normalization(features, training=True)
    return model_fn(features, labels, mode)

  values, _ = harness.train(bn_model_fn, X, Y, 1, session_config,
                            num_towers=2, ema_decay=DECAY)
  assert {"batch_normalization/moving_mean/ExponentialMovingAverage",
          "batch_normalization/moving_variance/ExponentialMovingAverage",
          "batch_normalization/gamma/ExponentialMovingAverage",
          "w/ExponentialMovingAverage"} <= set(values)


def test_user_saver_conflicts_with_averaged_weights(session_config):
  def saver_model_fn(features, labels, mode):
    spec = model_fn(features, labels, mode)
    return spec._replace(scaffold=tf1.train.Scaffold(saver=tf1.train.Saver()))

  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    with pytest.raises(ValueError, match="Scaffold sets a `saver`"):
      harness.call(emg.multi_gpu(saver_model_fn, ema_decay=DECAY),
                   tf.constant(X), tf.constant(Y), "eval", session_config)
