"""State of the examples kept across steps in a variable, read then written
by the train_op (truncated BPTT, a Keras stateful RNN's state): one device's
on 2 and 3 towers, uneven batches included.

- keyed by example ids (`gather`, then a scatter of the new rows): each
  tower's ids and rows are its shard's, so every tower's scatter runs and
  writes its own rows;
- batch-major (`[batch, units]`, the batch's row i is the state's row i): the
  variable spans the global batch, so everything it meets is computed on
  the global batch and written once.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

from tests import harness

tf1 = tf.compat.v1
UNITS = 3


def _step(h, x):
  w_x = tf1.get_variable("w_x", [4, UNITS],
                         initializer=tf1.glorot_uniform_initializer(1))
  w_h = tf1.get_variable("w_h", [UNITS, UNITS],
                         initializer=tf1.glorot_uniform_initializer(2))
  return tf.tanh(x @ w_x + h @ w_h)


def _keyed(spelling, batch):
  def state_fn(features):
    table = tf1.get_variable("state", [batch, UNITS], trainable=False,
                             initializer=tf1.constant_initializer(0.1))
    ids = features["id"]
    h = _step(tf.gather(table, ids), features["x"])
    final = tf.stop_gradient(h)
    if spelling == "scatter_update":
      write = tf1.scatter_update(table, ids, final)
    else:
      write = table.scatter_nd_update(ids[:, None], final)
    return h, write
  return state_fn


def _batch_major(spelling, batch):
  def state_fn(features):
    table = tf1.get_variable("state", [batch, UNITS], trainable=False,
                             initializer=tf1.constant_initializer(0.1))
    h = _step(table.read_value() if spelling == "read_value" else table,
              features["x"])
    final = tf.stop_gradient(h)
    write = (table.assign(final) if spelling == "read_value" else
             tf1.assign(table, final))
    return h, write
  return state_fn


def _moving_statistics(spelling, batch):
  """Batch norm by hand: the batch's moments normalize it, and moving
  averages of them are written by the train_op (a statistic of the batch,
  not rows: written once, the global batch's)."""
  del batch
  def state_fn(features):
    mm = tf1.get_variable("moving_mean", [4], trainable=False,
                          initializer=tf1.zeros_initializer())
    mv = tf1.get_variable("moving_variance", [4], trainable=False,
                          initializer=tf1.ones_initializer())
    mean, var = tf.nn.moments(features["x"], [0])
    x = (features["x"] - mean) * tf.math.rsqrt(var + 1e-3)
    if spelling == "assign":
      writes = [tf1.assign(mm, 0.9 * mm + 0.1 * mean),
                tf1.assign(mv, 0.9 * mv + 0.1 * var)]
    else:  # as Keras' moving averages: v -= (1 - momentum) * (v - value).
      writes = [mm.assign_sub(0.1 * (mm - mean)),
                tf1.assign_sub(mv, 0.1 * (mv - var))]
    return _step(tf.zeros([tf.shape(x)[0], UNITS]), x), tf.group(writes)
  return state_fn


STYLES = {"moving_statistics_assign": lambda b: _moving_statistics(
              "assign", b),
          "moving_statistics_assign_sub": lambda b: _moving_statistics(
              "assign_sub", b),
"keyed_scatter_update": lambda b: _keyed("scatter_update", b),
          "keyed_scatter_nd": lambda b: _keyed("scatter_nd", b),
          "batch_major_assign": lambda b: _batch_major("assign", b),
          "batch_major_read_value": lambda b: _batch_major("read_value", b)}


def make_model_fn(state_fn):
  def model_fn(features, labels, mode):
    h, write = state_fn(features)
    w_o = tf1.get_variable("w_o", [UNITS, 1],
                           initializer=tf1.glorot_uniform_initializer(3))
    loss = tf.reduce_mean(tf.square(h @ w_o - labels))
    with tf.control_dependencies([write]):
      train_op = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(
          0.3)).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn


def data(batch):
  rng = np.random.RandomState(batch)
  ids = rng.permutation(batch).astype(np.int32)
  return ({"id": ids, "x": rng.randn(batch, 4).astype(np.float32)},
          rng.randn(batch, 1).astype(np.float32))


@pytest.mark.parametrize("style", sorted(STYLES))
@pytest.mark.parametrize("towers,batch", [(2, 7), (3, 7), (3, 2)])
def test_state_of_the_examples_is_one_devices(style, towers, batch,
                                              session_config, caplog):
  fn = make_model_fn(STYLES[style](batch))
  features, labels = data(batch)
  want, _ = harness.train(fn, features, labels, 3, session_config)
  got, _ = harness.train(fn, features, labels, 3, session_config,
                         num_towers=towers)
  harness.assert_same_variables(got, want)
  assert not [r for r in caplog.records if "state" in r.getMessage() and
              r.levelname == "WARNING"]
