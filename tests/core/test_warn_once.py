"""Each warning is said once per wrapped model_fn and mode (#41).

A second model with the same problem is warned about again (it was once per
process: the second model of a process was silent); the same model built
again (Estimator's next `train` call) is not. Three warnings found while
building: per-tower gradient noise (`update.clipping`), batch norm over each
tower's shard (`cross_tower.sync_batch_norm`), a clip inside the model_fn.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
X, Y = harness.linear_data(7)


def _noisy(loss, opt):
  grads = opt.compute_gradients(loss)
  return opt.apply_gradients(
      [(g + tf1.truncated_normal(g.shape), v) for g, v in grads],
      tf1.train.get_global_step())


def _clipped(loss, opt):
  grads, variables = zip(*opt.compute_gradients(loss))
  grads, _ = tf.clip_by_global_norm(grads, 1.0)
  return opt.apply_gradients(zip(grads, variables),
                             tf1.train.get_global_step())


def _batch_norm(loss, opt):
  del loss
  x = tf1.layers.batch_normalization(tf.constant(X), training=True)
  return opt.minimize(tf.reduce_mean(tf1.layers.dense(x, 1)),
                      tf1.train.get_global_step())


CASES = {"noise": (_noisy, "random noise"),
         "clip": (_clipped, "transforms its gradients"),
         "batch_norm": (_batch_norm, "batch norm in training")}


def model_fn_with(train_op_of):
  def model_fn(features, labels, mode):
    w = tf1.get_variable("w", initializer=tf.zeros([3, 2]))
    loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
    return tf.estimator.EstimatorSpec(mode, loss=loss,
                                      train_op=train_op_of(loss, opt))
  return model_fn


def build(wrapped, session_config):
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    harness.call(wrapped, tf.constant(X), tf.constant(Y), "train",
                 session_config)


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_model_is_warned_once(case, caplog, session_config):
  train_op_of, words = CASES[case]
  model_fn = model_fn_with(train_op_of)
  first = emg.multi_gpu(model_fn, devices=harness.cpu_devices(2))
  second = emg.multi_gpu(model_fn, devices=harness.cpu_devices(3))
  with caplog.at_level(logging.WARNING, logger="absl"):
    for wrapped in (first, first, second):
      build(wrapped, session_config)
  said = [r.getMessage() for r in caplog.records if words in r.getMessage()]
  assert len(said) == 2, said  # first (built twice): once; second: once.


def test_outside_a_model_each_graph_is_warned(caplog):
  from estimator_multigpu.graph import warn_once  # pylint: disable=g-import-not-at-top
  with caplog.at_level(logging.WARNING, logger="absl"):
    for _ in range(2):
      with tf.Graph().as_default():
        assert warn_once.warn("topic", "said %s", "once")
        assert not warn_once.warn("topic", "said %s", "once")
  assert [r.getMessage() for r in caplog.records].count("said once") == 2
  np.testing.assert_equal(len(caplog.records), 2)
