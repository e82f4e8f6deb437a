"""global_ratio, cross_tower_sum and cross_tower_concat: exactly one
device's training for count-normalized and batch-coupled losses."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
MODES = ["shared", "replicated"]


def assert_same(one, many, atol=1e-5):
  for name, value in one.items():
    np.testing.assert_allclose(many[name], value, atol=atol, err_msg=name)


def train_op(loss):
  opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.3, 0.9))
  return opt.minimize(loss, tf1.train.get_global_step())


def dense(x, units, name):
  return tf1.layers.dense(x, units, name=name, kernel_initializer=(
      tf1.glorot_uniform_initializer(seed=len(name))))


def detection_model_fn(features, labels, mode, batch_norm=False):
  """Object Detection's normalize_loss_by_num_matches (batch norm: exact
  only with sync_batch_norm)."""
  h = dense(features, 6, "h")
  if batch_norm:
    h = tf1.layers.batch_normalization(h, training=mode == "train")
  scores = dense(tf.nn.relu(h), 4, "anchors")  # 4 anchors per example.
  matched = tf.cast(labels > 0.5, tf.float32)
  per_anchor = tf.square(scores - labels) * matched
  loss = emg.global_ratio(tf.reduce_sum(per_anchor), tf.reduce_sum(matched))
  update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
  with tf.control_dependencies(update_ops):
    op = train_op(loss)
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=op)


def detection_data(batch=7, seed=0):
  rng = np.random.RandomState(seed)
  return (rng.randn(batch, 3).astype(np.float32),
          rng.rand(batch, 4).astype(np.float32))


@pytest.mark.parametrize("sync_batch_norm", [False, True])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_towers", [2, 3])
def test_loss_divided_by_num_matches(num_towers, mode, sync_batch_norm,
                                     session_config):
  x, y = detection_data()
  def fn(features, labels, mode):
    return detection_model_fn(features, labels, mode, sync_batch_norm)
  one, loss_one = harness.train(fn, x, y, 3, session_config)
  many, loss_many = harness.train(
      fn, x, y, 3, session_config, num_towers=num_towers,
      variable_update=mode, sync_batch_norm=sync_batch_norm)
  np.testing.assert_allclose(loss_many, loss_one, rtol=1e-5)
  assert_same(one, many)


def test_sum_divided_by_the_configured_batch_size(session_config):
  """TPUEstimator-style reduce_sum(...) / params['batch_size']."""
  x, y = detection_data()

  def model_fn(features, labels, mode):
    per_example = tf.reduce_sum(tf.square(dense(features, 4, "p") - labels),
                                axis=1)
    loss = emg.global_ratio(tf.reduce_sum(per_example),
                            tf.cast(tf.shape(features)[0], tf.float32))
    return tf.estimator.EstimatorSpec(mode, loss=loss,
                                      train_op=train_op(loss))

  one, loss_one = harness.train(model_fn, x, y, 3, session_config)
  many, loss_many = harness.train(model_fn, x, y, 3, session_config,
                                  num_towers=3)
  np.testing.assert_allclose(loss_many, loss_one, rtol=1e-5)
  assert_same(one, many)


def in_batch_negatives_model_fn(features, labels, mode):
  """A dual encoder: each query's positive is its own row of the batch."""
  del labels
  q = tf.nn.l2_normalize(dense(features["q"], 5, "query"), axis=1)
  d = tf.nn.l2_normalize(dense(features["d"], 5, "doc"), axis=1)
  q_all, d_all = emg.cross_tower_concat(q), emg.cross_tower_concat(d)
  logits = 10.0 * tf.matmul(q_all, d_all, transpose_b=True)
  labels_all = tf.range(tf.shape(q_all)[0])
  loss = tf1.losses.sparse_softmax_cross_entropy(
      labels_all, logits, loss_collection=None,
      reduction=tf1.losses.Reduction.NONE)
  loss = tf.reduce_mean(loss)
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op(loss))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_towers", [2, 3])
def test_in_batch_negatives(num_towers, mode, session_config):
  rng = np.random.RandomState(1)
  features = {"q": rng.randn(7, 4).astype(np.float32),
              "d": rng.randn(7, 4).astype(np.float32)}
  one, loss_one = harness.train(in_batch_negatives_model_fn, features, None,
                                3, session_config)
  many, loss_many = harness.train(in_batch_negatives_model_fn, features,
                                  None, 3, session_config,
                                  num_towers=num_towers, variable_update=mode)
  np.testing.assert_allclose(loss_many, loss_one, rtol=1e-5)
  assert_same(one, many)


def test_concat_and_sum_values_against_numpy(session_config):
  """Batch 3 on 4 towers (one shard empty): every tower sees the whole."""
  x = np.arange(6, dtype=np.float32).reshape(3, 2)
  seen = {}

  def model_fn(features, labels, mode):
    del labels
    gathered = emg.cross_tower_concat(features)
    total = emg.cross_tower_sum(tf.reduce_sum(features, 0))
    ids = emg.cross_tower_concat(tf.cast(features[:, 0], tf.int32))
    seen.setdefault("outs", []).append((gathered, total, ids))
    return tf.estimator.EstimatorSpec(mode, predictions=features[:, 0])

  with tf.Graph().as_default():
    harness.call(emg.multi_gpu(model_fn, devices=harness.cpu_devices(4)),
                 tf.constant(x), None, "infer", session_config)
    with tf1.Session(config=session_config) as session:
      outs = session.run(seen["outs"])
  assert len(outs) == 4
  for gathered, total, ids in outs:
    np.testing.assert_array_equal(gathered, x)
    np.testing.assert_array_equal(total, x.sum(0))  # [6, 9]
    np.testing.assert_array_equal(ids, [0, 2, 4])


def test_unwrapped_they_are_the_plain_operations():
  with tf.Graph().as_default(), tf1.Session() as session:
    x = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    got = session.run([emg.global_ratio(tf.reduce_sum(x), 4.0),
                       emg.cross_tower_sum(x), emg.cross_tower_concat(x)])
  assert got[0] == pytest.approx(2.5)  # 10 / 4
  np.testing.assert_array_equal(got[1], [[1, 2], [3, 4]])
  np.testing.assert_array_equal(got[2], [[1, 2], [3, 4]])


def test_concat_when_the_global_batch_changes_between_steps(session_config):
  """Global batches of 5, 3, 5 and 1 rows on 2 towers, one graph: each step
  gathers that step's rows (forward and gradient) and trains like numpy."""
  x = np.arange(24, dtype=np.float32).reshape(8, 3) / 10.0

  def model_fn(features, labels, mode):
    del labels
    w = tf1.get_variable("w", [3, 1], initializer=tf1.ones_initializer())
    gathered = emg.cross_tower_concat(tf.matmul(features, w))
    loss = tf.reduce_mean(tf.square(gathered))
    sgd = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=sgd.minimize(
        loss, tf1.train.get_global_step()))

  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    features = tf1.placeholder(tf.float32, [None, 3])
    spec = harness.call(emg.multi_gpu(model_fn, devices=harness.cpu_devices(2)),
                        features, None, "train", session_config)
    w = tf1.global_variables("w")[0]
    with tf1.Session(config=session_config) as session:
      session.run(tf1.global_variables_initializer())
      want = np.ones([3, 1], np.float32)
      for rows in (slice(0, 5), slice(5, 8), slice(0, 5), slice(7, 8)):
        batch = x[rows]
        loss, _ = session.run([spec.loss, spec.train_op], {features: batch})
        np.testing.assert_allclose(loss, np.mean((batch @ want) ** 2),
                                   rtol=1e-5)
        # d/dw mean((Xw)²) = 2/n Xᵀ(Xw), at the rate 0.1.
        want = want - 0.1 * 2.0 / len(batch) * batch.T @ (batch @ want)
        np.testing.assert_allclose(session.run(w), want, rtol=1e-5)
