"""N towers train exactly like one device: checked against numpy.

Every test runs in each variable mode (`harness.VARIABLE_MODES`): shared
variables, and replicated ones with collective, add_n and packed all-reduce.

The model is linear regression, pred = x @ W + b, with loss
mean((pred - y)²) over the batch and the 2 outputs, whose gradient is
dW = 2 / (n·2) · xᵀ(pred - y), db = 2 / (n·2) · Σ (pred - y). numpy below
applies the TF1 update rules of SGD, Momentum and Adam to it.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
W0 = np.array([[0.1, -0.2], [0.3, 0.05], [-0.4, 0.2]], np.float32)
B0 = np.array([0.01, -0.02], np.float32)
LR = 0.05


def make_optimizer(name):
  return {"sgd": lambda: tf1.train.GradientDescentOptimizer(LR),
          "momentum": lambda: tf1.train.MomentumOptimizer(LR, 0.9),
          "adam": lambda: tf1.train.AdamOptimizer(LR)}[name]()


def linear_model_fn(optimizer_name):
  def model_fn(features, labels, mode, params):
    del params
    w = tf1.get_variable("w", initializer=W0)
    b = tf1.get_variable("b", initializer=B0)
    pred = tf.matmul(features, w) + b
    loss = tf.reduce_mean(tf.square(pred - labels))
    opt = emg.TowerOptimizer(make_optimizer(optimizer_name))
    train_op = opt.minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn



def numpy_train(optimizer_name, x, y, steps):
  """The TF1 update rules, applied to the whole batch on one device."""
  params = [W0.astype(np.float64), B0.astype(np.float64)]
  slots = [[np.zeros_like(p), np.zeros_like(p)] for p in params]
  for t in range(1, steps + 1):
    grads = harness.linear_gradients(x, y, *params)
    for p, g, (m, v) in zip(params, grads, slots):
      if optimizer_name == "sgd":
        p -= LR * g
      elif optimizer_name == "momentum":
        m[:] = 0.9 * m + g
        p -= LR * m
      else:  # adam, with TF1's bias correction folded into the rate.
        m[:] = 0.9 * m + 0.1 * g
        v[:] = 0.999 * v + 0.001 * g * g
        lr_t = LR * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        p -= lr_t * m / (np.sqrt(v) + 1e-8)
  return params


CASES = [("sgd", 1), ("momentum", 5), ("adam", 5)]
MODES = pytest.mark.parametrize("mode", list(harness.VARIABLE_MODES))


@MODES
@pytest.mark.parametrize("num_towers", [1, 2, 3, 4])
@pytest.mark.parametrize("batch", [12, 7, 2])  # divisible, not, smaller.
@pytest.mark.parametrize("optimizer_name,steps", CASES)
def test_towers_match_numpy(num_towers, batch, optimizer_name, steps, mode,
                            session_config):
  x, y = harness.linear_data(batch)
  values, _ = harness.train(linear_model_fn(optimizer_name), x, y, steps,
                            session_config, num_towers=num_towers,
                            **harness.VARIABLE_MODES[mode])
  want_w, want_b = numpy_train(optimizer_name, x, y, steps)
  np.testing.assert_allclose(values["w"], want_w, atol=1e-5)
  np.testing.assert_allclose(values["b"], want_b, atol=1e-5)
  assert values["global_step"] == steps


@MODES
@pytest.mark.parametrize("num_towers,batch", [(3, 7), (4, 2), (2, 5)])
def test_batch_size_known_only_at_run_time(num_towers, batch, mode,
                                           session_config):
  x, y = harness.linear_data(batch)
  values, loss = harness.train(linear_model_fn("momentum"), x, y, 5,
                               session_config, num_towers=num_towers,
                               dynamic_batch=True,
                               **harness.VARIABLE_MODES[mode])
  want_w, want_b = numpy_train("momentum", x, y, 5)
  np.testing.assert_allclose(values["w"], want_w, atol=1e-5)
  np.testing.assert_allclose(values["b"], want_b, atol=1e-5)
  residual = x @ W0 + B0 - y
  np.testing.assert_allclose(loss, np.mean(residual ** 2), rtol=1e-5)


@MODES
@pytest.mark.parametrize("num_towers", [2, 3, 4])
def test_sum_reduction_matches_numpy(num_towers, mode, session_config):
  # With loss = Σ over examples of mean over outputs, the gradient is n times
  # the "mean" gradient: SGD with LR / n must land where the mean run lands.
  x, y = harness.linear_data(7)

  def model_fn(features, labels, mode):
    w = tf1.get_variable("w", initializer=W0)
    b = tf1.get_variable("b", initializer=B0)
    pred = tf.matmul(features, w) + b
    loss = tf.reduce_sum(tf.reduce_mean(tf.square(pred - labels), axis=1))
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(LR / 7))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
        loss, tf1.train.get_global_step()))

  values, loss = harness.train(model_fn, x, y, 1, session_config,
                               num_towers=num_towers, loss_reduction="sum",
                               **harness.VARIABLE_MODES[mode])
  want_w, want_b = numpy_train("sgd", x, y, 1)
  np.testing.assert_allclose(values["w"], want_w, atol=1e-5)
  np.testing.assert_allclose(values["b"], want_b, atol=1e-5)
  residual = x @ W0 + B0 - y
  np.testing.assert_allclose(loss, np.sum(np.mean(residual ** 2, axis=1)),
                             rtol=1e-5)


@MODES
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_empty_shards_give_no_nan(reduction, mode, session_config):
  # Batch 2 over 4 towers: towers 2 and 3 get no examples; their mean loss is
  # NaN (a mean over nothing) but must add nothing to the loss or gradients.
  x, y = harness.linear_data(2)
  scale = 1.0 if reduction == "mean" else 2.0

  def model_fn(features, labels, mode):
    w = tf1.get_variable("w", initializer=W0)
    b = tf1.get_variable("b", initializer=B0)
    per_example = tf.reduce_mean(tf.square(tf.matmul(features, w) + b -
                                           labels), axis=1)
    loss = (tf.reduce_mean(per_example) if reduction == "mean" else
            tf.reduce_sum(per_example))
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(LR / scale))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
        loss, tf1.train.get_global_step()))

  values, loss = harness.train(model_fn, x, y, 1, session_config,
                               num_towers=4, loss_reduction=reduction,
                               **harness.VARIABLE_MODES[mode])
  assert np.isfinite(loss)
  want_w, want_b = numpy_train("sgd", x, y, 1)
  np.testing.assert_allclose(values["w"], want_w, atol=1e-5)
  np.testing.assert_allclose(values["b"], want_b, atol=1e-5)
