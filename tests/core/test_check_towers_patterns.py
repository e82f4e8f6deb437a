"""check_towers on issue #30's patterns: accumulation, Keras Conv2D, replicated
variables with a var_list filtered in Python, and the
causes it names (per-tower gradient noise, state updated in the train_op);
the per-tower noise warning of `multi_gpu`, checked statistically too."""

import functools
import logging

import numpy as np
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
DEVICES = ["/cpu:0", "/cpu:1"]
RNG = np.random.RandomState(0)
X = RNG.randn(7, 3).astype(np.float32)
Y = RNG.randn(7, 2).astype(np.float32)


def batches_fn():
  """Different batches of 5, 5, 4, ... (the dataset repeats 7 examples)."""
  return tf.data.Dataset.from_tensor_slices((X, Y)).repeat().batch(5)


def linear_fn(features, labels, mode, grads_fn=lambda g: g, state=None):
  w = tf1.get_variable("w", initializer=tf.constant(
      [[0.1, -0.2], [0.3, 0.05], [-0.4, 0.2]]))
  loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
  opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.1, 0.9))
  grads, tvars = zip(*opt.compute_gradients(loss))
  train_op = opt.apply_gradients(zip(grads_fn(list(grads)), tvars),
                                 tf1.train.get_global_step())
  if state is not None:
    train_op = tf.group(train_op, state(features))
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def noisy(grads):
  return [g + tf.random.normal(tf.shape(g)) * 0.5 for g in grads]


def moving_mean(features):
  mean = tf1.get_variable("moving_mean", initializer=tf.zeros([3]),
                          trainable=False)
  return tf1.assign_sub(mean, (mean - tf.reduce_mean(features, 0)) * 0.1)


def test_accumulation_is_no_false_alarm():
  report = emg.check_towers(linear_fn, batches_fn, DEVICES, steps=2,
                            accumulate_steps=2)
  assert report.ok, str(report)


def test_keras_conv2d():
  def conv_fn(features, labels, mode):
    images = tf.reshape(tf.tile(features, [1, 3]), [-1, 3, 3, 1])
    conv = tf.keras.layers.Conv2D(2, 3, kernel_initializer=(
        tf1.constant_initializer(0.1)), name="conv")
    loss = tf.reduce_mean(tf.square(tf.reshape(conv(images), [-1, 2]) -
                                    labels))
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
    return tf.estimator.EstimatorSpec(
        mode, loss=loss,
        train_op=opt.minimize(loss, tf1.train.get_global_step()))

  report = emg.check_towers(conv_fn, batches_fn, ["/cpu:0", "/cpu:1",
                                                  "/cpu:2"])
  assert report.ok, str(report)


def test_names_per_tower_noise():
  """The draw is held fixed (0) in both runs, so w agrees; the noise added
  to each tower's gradient is found in the towers' graph all the same."""
  report = emg.check_towers(
      functools.partial(linear_fn, grads_fn=noisy), batches_fn, DEVICES)
  assert not report.ok
  assert "random noise is added to each tower's gradients (w)" in str(report)
  assert "agree with one device only because" in str(report)


class _NoisyOnce(tf1.train.GradientDescentOptimizer):
  """Adds N(0, 0.5²) noise to the gradients it applies: inside
  TowerOptimizer, once, to the combined gradients (the fix the report
  names)."""

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    return super().apply_gradients(
        [(noisy([g])[0], v) for g, v in grads_and_vars], global_step, name)


def forward_draws_fn(features, labels, mode):
  """Random draws of the forward pass: a random scale of the inputs
  (augmentation) and dropout; the optimizer adds noise once."""
  scaled = features * tf.random.uniform(tf.shape(features), 0.5, 1.5)
  hidden = tf1.layers.dense(scaled, 4, tf.nn.relu, name="hidden",
                            kernel_initializer=tf1.constant_initializer(0.2))
  hidden = tf.nn.dropout(hidden, rate=0.3)
  loss = tf.reduce_mean(tf.square(tf1.layers.dense(
      hidden, 2, name="out", kernel_initializer=(
          tf1.constant_initializer(-0.1))) - labels))
  opt = emg.TowerOptimizer(_NoisyOnce(0.1))
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
      loss, tf1.train.get_global_step()))


def test_forward_draws_and_noise_added_once_are_no_false_alarm():
  """Dropout and augmentation draw per example, so each tower's draws are
  one device's in distribution; noise added to the combined gradients is
  drawn once. Held fixed in both runs, they compare exactly."""
  report = emg.check_towers(forward_draws_fn, batches_fn, DEVICES, steps=2)
  assert report.ok, str(report)


def test_state_updated_in_the_train_op_is_one_devices():
  """A moving average of the batch's mean, written by the train_op: the
  global batch's mean is written once (it was tower 0's shard's)."""
  report = emg.check_towers(
      functools.partial(linear_fn, state=moving_mean), batches_fn, DEVICES)
  assert report.ok, str(report)
  worst = dict(report.worst)
  assert worst["moving_mean"] < 1e-5, report.worst


def test_noise_warning_and_its_standard_deviation(caplog,
                                                  session_config):
  """Two even towers (4 + 4): each tower's N(0, 0.5²) draw is weighted by
  1/2, so the applied noise has std 0.5·√(2·¼) ≈ 0.354 where one device's
  is 0.5. With SGD at rate 1 from w = 0 on a loss with zero gradient
  (labels = x·0), w after one step is minus the noise: 600 draws."""

  def zero_grad_fn(features, labels, mode):
    del labels
    w = tf1.get_variable("w", initializer=tf.zeros([20, 30]))
    loss = tf.reduce_mean(tf.matmul(features, w)) * 0.0
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(1.0))
    grads, tvars = zip(*opt.compute_gradients(loss))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=(
        opt.apply_gradients(zip(noisy(list(grads)), tvars))))

  x = np.ones([8, 20], np.float32)
  with caplog.at_level(logging.WARNING, logger="absl"):
    got, _ = harness.train(zero_grad_fn, x, None, 1, session_config,
                           num_towers=2)
  assert "adds random noise to its gradients inside each tower (w" in (
      caplog.text)
  std = got["w"].std()
  # 600 normal draws: the sample std is within ±10% of the true one with
  # probability > 0.99 (its relative std is 1/√1200 ≈ 2.9%).
  assert 0.5 * np.sqrt(0.5) * 0.9 < std < 0.5 * np.sqrt(0.5) * 1.1


def test_replicated_with_a_var_list_filtered_in_python():
  def frozen_bias_fn(features, labels, mode):
    w = tf1.get_variable("w", initializer=tf.fill([3, 2], 0.1))
    b = tf1.get_variable("b", initializer=tf.zeros([2]))
    loss = tf.reduce_mean(tf.square(tf.matmul(features, w) + b - labels))
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
    var_list = [v for v in tf1.trainable_variables()
                if v.op.name.startswith("w")]
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
        loss, tf1.train.get_global_step(), var_list=var_list))

  report = emg.check_towers(frozen_bias_fn, batches_fn, DEVICES,
                            variable_update="replicated")
  assert report.ok, str(report)
