"""State a model_fn updates in its own train_op, outside UPDATE_OPS (#30).

2 and 3 towers over an uneven batch of 7 against the unwrapped model_fn
(plain TF) to 1e-5: an example counter `assign_add(batch)` is exact; a
counter made global with `cross_tower_sum` inside the train_op is exact and
does not wait for its peers; a hand-written batch norm over
`cross_tower_moments` (no `sync_batch_norm`) is exact, moving mean included,
and so is center loss from global per-class sums and counts.
Center loss and a hand-written batch norm over `tf.nn.moments`, which cannot
be made exact, log a warning naming the variable and the tool.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
BATCH = 7
X, Y = harness.linear_data(BATCH)
CLASSES = np.array([0, 1, 0, 2, 1, 0, 2], np.int32)
W0 = np.array([[0.1, -0.2], [0.3, 0.05], [-0.4, 0.2]], np.float32)


def model_fn_with(state_update):
  """A linear model whose train_op also runs `state_update(x, y, h)`."""

  def model_fn(features, labels, mode):
    w = tf1.get_variable("w", initializer=W0)
    h, update = state_update(features, labels, w)
    loss = tf.reduce_mean(tf.square(tf.matmul(h, w) - labels))
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
    train_op = tf.group(opt.minimize(loss, tf1.train.get_global_step()),
                        update)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  return model_fn


def counter(features, labels, w):
  del labels, w
  examples = tf1.get_variable("examples", initializer=0.0, trainable=False)
  return features, examples.assign_add(
      tf.cast(tf.shape(features)[0], tf.float32))


def global_counter(features, labels, w):
  del labels, w
  examples = tf1.get_variable("examples", initializer=0.0, trainable=False)
  return features, examples.assign_add(emg.cross_tower_sum(
      tf.cast(tf.shape(features)[0], tf.float32)))


def batch_norm_with(moments):
  def batch_norm(features, labels, w):
    del labels, w
    moving_mean = tf1.get_variable("moving_mean", initializer=tf.zeros([3]),
                                   trainable=False)
    mean, variance = moments(features, [0])
    normalized = (features - mean) * tf.math.rsqrt(variance + 1e-3)
    # What moving_averages.assign_moving_average(decay=0.9) builds.
    return normalized, tf1.assign_sub(moving_mean,
                                      (moving_mean - mean) * 0.1)
  return batch_norm


def center_loss(features, labels, w):
  """Centers move by α·Σ(cᵧ - f)/(1 + nᵧ) over the batch's examples."""
  del labels
  centers = tf1.get_variable("centers", initializer=tf.zeros([3, 2]),
                             trainable=False)
  classes = tf.constant(CLASSES)[:tf.shape(features)[0]]
  embedded = tf.matmul(features, w)
  counts = tf.math.bincount(classes, minlength=3, dtype=tf.float32)
  diff = tf.gather(centers, classes) - embedded
  diff /= 1.0 + tf.gather(counts, classes)[:, None]
  return features, tf1.scatter_sub(centers, classes, 0.5 * diff)


def global_center_loss(features, labels, w):
  """The warning's fix: per-class sums and counts over the global batch."""
  centers = tf1.get_variable("centers", initializer=tf.zeros([2, 2]),
                             trainable=False)
  del w  # embeddings that do not race with the update of w.
  classes = tf.cast(labels[:, 0] > 0, tf.int32)
  embedded = features[:, :2]
  counts = tf.math.unsorted_segment_sum(tf.ones_like(embedded[:, 0]),
                                        classes, 2)
  sums = tf.math.unsorted_segment_sum(tf.gather(centers, classes) - embedded,
                                      classes, 2)
  delta = 0.5 * emg.cross_tower_sum(sums) / (
      1.0 + emg.cross_tower_sum(counts))[:, None]
  return features, tf1.assign_sub(centers, delta)


def assert_exact(model_fn, num_towers, session_config, **options):
  want, _ = harness.train(model_fn, X, Y, 3, session_config)
  got, _ = harness.train(model_fn, X, Y, 3, session_config,
                         num_towers=num_towers, **options)
  for name in want:
    np.testing.assert_allclose(got[name], want[name], atol=1e-5,
                               err_msg=name)
  return got


@pytest.mark.parametrize("num_towers", [2, 3])
def test_example_counter_counts_the_global_batch(num_towers, session_config):
  got = assert_exact(model_fn_with(counter), num_towers, session_config)
  assert got["examples"] == 3 * BATCH  # 3 steps of 7 examples.


@pytest.mark.parametrize("variable_update", ["shared", "replicated"])
def test_cross_tower_sum_inside_the_train_op_runs(variable_update,
                                                  session_config):
  got = assert_exact(model_fn_with(global_counter), 3, session_config,
                     variable_update=variable_update)
  assert got["examples"] == 3 * BATCH


def test_center_loss_over_the_global_batch(session_config):
  got = assert_exact(model_fn_with(global_center_loss), 3, session_config)
  assert np.abs(got["centers"]).max() > 0.01  # the centers moved.


@pytest.mark.parametrize("num_towers", [2, 3])
def test_hand_written_batch_norm_over_cross_tower_moments(num_towers,
                                                          session_config):
  """`cross_tower_moments` is global without sync_batch_norm too."""
  got = assert_exact(model_fn_with(batch_norm_with(emg.cross_tower_moments)),
                     num_towers, session_config)
  # moving_mean: 0 -> 0.1·m -> 0.19·m -> 0.271·m (x is not trained).
  np.testing.assert_allclose(got["moving_mean"], 0.271 * X.mean(0),
                             atol=1e-6)


@pytest.mark.parametrize("num_towers", [2, 3])
def test_center_loss_of_the_batchs_classes_is_one_devices(num_towers,
                                                          session_config):
  """The classes of the batch sliced from a constant by its size are the
  global batch's, so the centers' scatter writes the global batch's rows
  (gathered), once per step."""
  got = assert_exact(model_fn_with(center_loss), num_towers, session_config)
  assert np.abs(got["centers"]).max() > 0.01  # the centers moved.


@pytest.mark.parametrize("num_towers", [2, 3])
def test_hand_written_batch_norm_over_tf_nn_moments(num_towers, caplog,
                                                    session_config):
  """The same with `tf.nn.moments`: the write of a moving average of the
  batch's mean writes the global batch's, once (it was tower 0's shard's,
  warned), with no warning."""
  with caplog.at_level(logging.WARNING, logger="absl"):
    got = assert_exact(model_fn_with(batch_norm_with(tf.nn.moments)),
                       num_towers, session_config)
  np.testing.assert_allclose(got["moving_mean"], 0.271 * X.mean(0),
                             atol=1e-6)
  assert "shard only" not in caplog.text


def test_no_warning_for_updates_the_towers_agree_on(caplog, session_config):
  """The model_fn's own EMA of the weights is the same in every tower."""
  def ema(features, labels, w):
    del labels
    return features, tf.train.ExponentialMovingAverage(0.9).apply([w])

  with caplog.at_level(logging.WARNING, logger="absl"):
    harness.train(model_fn_with(ema), X, Y, 1, session_config, num_towers=2)
  assert "shard only" not in caplog.text


def test_counter_with_even_shards(session_config):
  """8 examples on 2 towers: both shards' counts are the constant 4 (a
  static shape); it is still each tower's own count."""
  x, y = harness.linear_data(8)
  got, _ = harness.train(model_fn_with(counter), x, y, 2, session_config,
                         num_towers=2)
  assert got["examples"] == 2 * 8
