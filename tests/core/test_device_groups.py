"""Hybrid data and model parallelism: each tower gets a group of devices.

Two towers, each spread over two virtual CPUs: layer 1 on the group's first
device, layer 2 on its second. The graph shows the placement, and training
equals numpy on one device: hidden = x @ W1, pred = hidden @ W2, loss =
mean((pred - y)²), so dW2 = hiddenᵀ·r·2/n and dW1 = xᵀ·(r·W2ᵀ)·2/n with
r = pred - y.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
GROUPS = [["/cpu:0", "/cpu:1"], ["/cpu:2", "/cpu:3"]]
X, Y = harness.linear_data(7, in_dim=3, out_dim=1, seed=2)
W1 = np.array([[0.2, -0.1], [0.4, 0.3], [-0.5, 0.1]], np.float32)
W2 = np.array([[0.7], [-0.3]], np.float32)
LR = 0.1


def two_layer_model_fn(features, labels, mode):
  first, second = emg.tower_devices() or [None, None]
  with tf.device(first):
    hidden = tf.matmul(features, tf1.get_variable("w1", initializer=W1),
                       name="layer1")
  with tf.device(second):
    pred = tf.matmul(hidden, tf1.get_variable("w2", initializer=W2),
                     name="layer2")
  loss = tf.reduce_mean(tf.square(pred - labels))
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(LR))
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
      loss, tf1.train.get_global_step()))


def numpy_sgd(steps):
  w1, w2 = W1.astype(np.float64), W2.astype(np.float64)
  for _ in range(steps):
    hidden = X @ w1
    residual = hidden @ w2 - Y
    grad_w2 = 2.0 / len(X) * hidden.T @ residual
    grad_w1 = 2.0 / len(X) * X.T @ (residual @ w2.T)
    w1, w2 = w1 - LR * grad_w1, w2 - LR * grad_w2
  return w1, w2


def test_layers_land_on_the_devices_of_each_group(session_config):
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    harness.call(emg.multi_gpu(two_layer_model_fn, devices=GROUPS),
                 tf.constant(X), tf.constant(Y), "train", session_config)
    device = lambda name: tf1.get_default_graph().get_operation_by_name(
        name).device
    assert device("layer1") == "/device:CPU:0"
    assert device("layer2") == "/device:CPU:1"
    assert device("tower_1/layer1") == "/device:CPU:2"
    assert device("tower_1/layer2") == "/device:CPU:3"


@pytest.mark.parametrize("variable_update", ["shared", "replicated"])
def test_device_groups_train_like_one_device(variable_update, session_config):
  values, _ = harness.train(two_layer_model_fn, X, Y, 3, session_config,
                            num_towers=None)
  want_w1, want_w2 = numpy_sgd(3)
  np.testing.assert_allclose(values["w1"], want_w1, atol=1e-5)
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    spec = harness.call(emg.multi_gpu(two_layer_model_fn, devices=GROUPS,
                                      variable_update=variable_update),
                        tf.constant(X), tf.constant(Y), "train",
                        session_config)
    with tf1.Session(config=session_config) as session:
      initializers = [tf1.global_variables_initializer(),
                      tf1.local_variables_initializer()]
      for initializer in initializers:
        session.run(initializer)
      for _ in range(3):
        session.run(spec.train_op)
      got = {v.op.name: session.run(v) for v in tf1.trainable_variables()}
  np.testing.assert_allclose(got["w1"], want_w1, atol=1e-5)
  np.testing.assert_allclose(got["w2"], want_w2, atol=1e-5)


@pytest.mark.parametrize("groups,message", [
    ([["/cpu:0"], []], "is empty or repeats a device"),
    ([["/cpu:0", "/cpu:0"]], "is empty or repeats a device"),
    ([["/cpu:0", "/cpu:1"], ["/cpu:0", "/cpu:2"]], "lists /cpu:0 more than"),
])
def test_bad_groups(groups, message):
  with pytest.raises(ValueError, match=message):
    emg.multi_gpu(two_layer_model_fn, devices=groups)


def test_tower_devices_outside_multi_gpu_is_empty():
  assert emg.tower_devices() == []
