"""Writes no op runs are no writes (#52 row 5).

A Keras batch-norm layer called with `training=True` makes the assignments
of its moving statistics (`layer.updates`); a model_fn that never runs them
(it neither groups them into the train_op nor gives them to a hook) leaves
the moving statistics alone, on one device and on the towers alike: no
warning that the model_fn writes them from tower 0's shard. A write a hook
of the spec holds may run: that one is still named. The v1 layers' updates
(UPDATE_OPS) run with every step and are not warned about either. (Batch
norm in training without `sync_batch_norm` keeps its own warning: it
normalizes each tower's shard.)
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
X = np.random.RandomState(3).randn(7, 3).astype(np.float32)
Y = np.random.RandomState(4).randn(7, 2).astype(np.float32)
WRITE_WARNING = "from tower 0's shard only"


class _RunsOp(tf1.train.SessionRunHook):
  def __init__(self, op):
    self.op = op

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs(self.op)


def model_fn_for(spelling, hook=False):
  def model_fn(features, labels, mode):
    hidden = tf1.layers.dense(features, 4, name="h", kernel_initializer=(
        tf1.glorot_uniform_initializer(seed=1)))
    hooks = []
    if spelling == "keras_layer":
      layer = tf.keras.layers.BatchNormalization(name="bn")
      hidden = layer(hidden, training=True)
      hooks = [_RunsOp(tf.group(layer.updates))] if hook else []
    elif spelling == "keras_sequential":
      model = tf.keras.Sequential([tf.keras.layers.BatchNormalization(
          name="bn")])
      hidden = model(hidden, training=True)
    else:  # v1: the updates go to UPDATE_OPS, which run with the step.
      hidden = tf1.layers.batch_normalization(hidden, training=True,
                                              name="bn")
    loss = tf1.losses.mean_squared_error(labels, tf1.layers.dense(
        hidden, 2, name="out", kernel_initializer=(
            tf1.glorot_uniform_initializer(seed=2))))
    train_op = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(
        0.1)).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                      training_hooks=hooks)
  return model_fn


@pytest.mark.parametrize("num_towers", [2, 3])
@pytest.mark.parametrize("spelling", ["keras_layer", "keras_sequential",
                                      "v1_layer"])
def test_updates_no_op_runs_are_not_warned(caplog, session_config, spelling,
                                           num_towers):
  with caplog.at_level(logging.WARNING, logger="absl"):
    got, _ = harness.train(model_fn_for(spelling), X, Y, 2, session_config,
                           num_towers=num_towers)
  assert WRITE_WARNING not in caplog.text
  assert "normalizes each tower's shard" in caplog.text  # the layer's own.
  if spelling != "v1_layer":  # nothing ran them: the initial statistics.
    mean, = [v for k, v in got.items() if k.endswith("bn/moving_mean")]
    variance, = [v for k, v in got.items()
                 if k.endswith("bn/moving_variance")]
    np.testing.assert_array_equal(mean, np.zeros(4))
    np.testing.assert_array_equal(variance, np.ones(4))


def test_updates_a_hook_holds_are_still_named(caplog, session_config):
  with caplog.at_level(logging.WARNING, logger="absl"):
    harness.train(model_fn_for("keras_layer", hook=True), X, Y, 1,
                  session_config, num_towers=2)
  # A hook runs the layer's update: tower 0's shard's statistics, which the
  # layer's one local-statistics warning names (issue 54: one line per
  # cause), not a second warning about a write.
  assert "normalizes each tower's shard" in caplog.text
  assert WRITE_WARNING not in caplog.text
