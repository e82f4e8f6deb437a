"""Couplings of the batch and the package's cross-tower tools inside
`tf.cond` branches are one device's; inside `tf.while_loop` bodies (and
`tf.map_fn`, which is one) a statistic of the batch meeting its examples is
a clear error naming the loop; a branch that computes on the global batch
under a predicate of the tower's own rows is a clear error, never a hang.
2 and 3 towers, a batch of 7 (uneven) and of 2 (an empty shard)."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

from tests import harness
from tests.global_batch.test_generated_model_fns import _centered
from tests.global_batch.test_generated_model_fns import _standardized

tf1 = tf.compat.v1


def _square_error(pred, labels):
  return tf.reduce_mean(tf.square(pred - labels))


def cross_tower_sum_in_cond(pred, labels, on):
  err = tf.reduce_sum(tf.square(pred - labels))
  count = emg.cross_tower_sum(tf.cast(tf.shape(pred)[0], tf.float32))
  return tf.cond(on, lambda: emg.cross_tower_sum(err) / count,
                 lambda: err)


def global_ratio_in_cond(pred, labels, on):
  err = tf.reduce_sum(tf.square(pred - labels))
  rows = tf.cast(tf.shape(pred)[0], tf.float32)
  return tf.cond(on, lambda: emg.global_ratio(err, rows), lambda: err)


def centered_in_cond(pred, labels, on):
  return tf.cond(on, lambda: _square_error(_centered(pred), labels),
                 lambda: _square_error(pred, labels))


def standardized_in_v1_cond(pred, labels, on):
  return tf1.cond(on, lambda: _square_error(_standardized(pred), labels),
                  lambda: _square_error(pred, labels))


def batch_mean_out_of_cond(pred, labels, on):
  """Centered by hand with the statistic a tf.cond returns (training: the
  batch's mean; else a fixed one), applied outside the branches."""
  mean = tf.cond(on, lambda: tf.reduce_mean(pred, 0), lambda: tf.zeros([2]))
  return _square_error(pred - mean, labels)


def predicate_of_the_batch(pred, labels, on):
  del on
  return tf.cond(tf.reduce_mean(pred) > -100.0,
                 lambda: _square_error(_centered(pred), labels),
                 lambda: tf.reduce_mean(tf.abs(pred - labels)))


def centered_in_while_loop(pred, labels, on):
  del on
  def body(i, total):
    return i + 1, total + _square_error(_centered(pred), labels)
  return tf.while_loop(lambda i, total: i < 2, body, [0, 0.0])[1]


def standardized_in_while_loop(pred, labels, on):
  del on
  def body(i, total):
    return i + 1, total + _square_error(_standardized(pred), labels)
  return tf.while_loop(lambda i, total: i < 2, body, [0, 0.0])[1]


def predicate_of_a_count(pred, labels, on):
  """A count of the rows tf.where finds: the global batch's count."""
  del on
  positive = tf.size(tf.where(pred > 0.0)) > 3
  return tf.cond(positive, lambda: _square_error(_centered(pred), labels),
                 lambda: _square_error(pred, labels))


def predicate_of_the_rows(pred, labels, on):
  del on
  found = tf.gather(pred[:, 0], tf.where(pred[:, 0] > 0.0)[:, 0])
  positive = tf.reduce_any(found > 0.5)  # of rows counted by their values.
  return tf.cond(positive, lambda: _square_error(_centered(pred), labels),
                 lambda: _square_error(pred, labels))


EXACT = {"cross_tower_sum_in_cond": cross_tower_sum_in_cond,
         "global_ratio_in_cond": global_ratio_in_cond,
         "centered_in_cond": centered_in_cond,
         "batch_mean_out_of_cond": batch_mean_out_of_cond,
         "standardized_in_v1_cond": standardized_in_v1_cond,
         "predicate_of_the_batch": predicate_of_the_batch,
         "predicate_of_a_count": predicate_of_a_count}
REFUSED = {"centered_in_while_loop": (centered_in_while_loop, "while_loop"),
           "standardized_in_while_loop": (standardized_in_while_loop,
                                         "while_loop"),
           "predicate_of_the_rows": (predicate_of_the_rows, "predicate")}


def make_model_fn(loss_of):
  def model_fn(features, labels, mode):
    w = tf1.get_variable("w", [3, 2], initializer=tf1.constant_initializer(
        [[0.5, -0.4], [0.3, 0.2], [-0.1, 0.6]]))
    step = tf1.train.get_global_step()
    loss = loss_of(features @ w, labels, step >= 0)
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
    return tf.estimator.EstimatorSpec(mode, loss=loss,
                                      train_op=opt.minimize(loss, step))
  return model_fn


@pytest.mark.parametrize("name", sorted(EXACT))
@pytest.mark.parametrize("towers,batch", [(2, 7), (3, 7), (3, 2)])
def test_couplings_in_branches_are_one_devices(name, towers, batch,
                                                session_config):
  x, y = harness.linear_data(batch, seed=batch)
  fn = make_model_fn(EXACT[name])
  want, want_loss = harness.train(fn, x, y, 2, session_config)
  got, got_loss = harness.train(fn, x, y, 2, session_config,
                                num_towers=towers)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
  harness.assert_same_variables(got, want)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_cannot_be_exact_in_control_flow_is_refused(name,
                                                          session_config):
  loss_of, named = REFUSED[name]
  x, y = harness.linear_data(7, seed=1)
  with pytest.raises(ValueError, match=rf"multi_gpu: .*{named}"):
    harness.train(make_model_fn(loss_of), x, y, 1, session_config,
                  num_towers=2)
