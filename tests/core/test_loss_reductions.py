"""tf.compat.v1.losses under every reduction, and hand-written normalizers
through `emg.global_ratio`, train like one device (issue: silent wrong
numbers in seq2seq, detection and retrieval code)."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
R = tf1.losses.Reduction
VOCAB, TIME, DIM = 11, 5, 4
REDUCTIONS = [R.SUM_BY_NONZERO_WEIGHTS, R.SUM_OVER_NONZERO_WEIGHTS, R.MEAN,
              R.SUM, R.SUM_OVER_BATCH_SIZE]


def sequences(batch=7, seed=0):
  """Token ids, next-token labels and a padding mask of ragged lengths."""
  rng = np.random.RandomState(seed)
  tokens = rng.randint(1, VOCAB, size=(batch, TIME)).astype(np.int32)
  lengths = rng.randint(1, TIME + 1, size=batch)
  mask = (np.arange(TIME)[None, :] < lengths[:, None]).astype(np.float32)
  labels = rng.randint(0, VOCAB, size=(batch, TIME)).astype(np.int32)
  return {"tokens": tokens, "mask": mask}, labels


def logits_of(features):
  embeddings = tf1.get_variable(
      "embeddings", [VOCAB, DIM],
      initializer=tf1.random_normal_initializer(seed=1))
  hidden = tf.nn.embedding_lookup(embeddings, features["tokens"])
  return tf1.layers.dense(hidden, VOCAB, name="out",
                          kernel_initializer=tf1.glorot_uniform_initializer(
                              seed=2))


def train_op(loss):
  opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.5, 0.9))
  return opt.minimize(loss, tf1.train.get_global_step())


def token_loss_fn(reduction, weighted=True):
  def model_fn(features, labels, mode):
    logits = logits_of(features)
    loss = tf1.losses.sparse_softmax_cross_entropy(
        labels, logits, weights=features["mask"] if weighted else 1.0,
        reduction=reduction)
    return tf.estimator.EstimatorSpec(mode, loss=loss,
                                      train_op=train_op(loss))
  return model_fn


def assert_same(one, many, atol=1e-5):
  assert set(one) <= set(many)
  for name, value in one.items():
    np.testing.assert_allclose(many[name], value, atol=atol, err_msg=name)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("num_towers", [2, 3])
def test_weighted_token_loss_matches_one_device(reduction, num_towers,
                                                session_config):
  features, labels = sequences()
  fn = token_loss_fn(reduction)
  one, loss_one = harness.train(fn, features, labels, 3, session_config)
  many, loss_many = harness.train(fn, features, labels, 3, session_config,
                                  num_towers=num_towers)
  np.testing.assert_allclose(loss_many, loss_one, rtol=1e-5)
  assert_same(one, many)


@pytest.mark.parametrize("variable_update", ["shared", "replicated"])
def test_several_terms_with_their_own_normalizers(variable_update,
                                                  session_config):
  """A token mean, a per-example mean and a sum in one total; 3 towers."""
  def model_fn(features, labels, mode):
    logits = logits_of(features)
    tf1.losses.sparse_softmax_cross_entropy(labels, logits,
                                            weights=features["mask"])
    tf1.losses.mean_squared_error(tf.zeros([tf.shape(logits)[0]]),
                                  tf.reduce_mean(logits, [1, 2]))
    tf1.losses.absolute_difference(
        tf.zeros_like(logits[:, 0, :2]), logits[:, 0, :2],
        reduction=R.SUM)
    loss = tf1.losses.get_total_loss()
    return tf.estimator.EstimatorSpec(mode, loss=loss,
                                      train_op=train_op(loss))

  features, labels = sequences()
  one, loss_one = harness.train(model_fn, features, labels, 3,
                                session_config)
  many, loss_many = harness.train(model_fn, features, labels, 3,
                                  session_config, num_towers=3,
                                  variable_update=variable_update)
  np.testing.assert_allclose(loss_many, loss_one, rtol=1e-5)
  assert_same(one, many)


def test_loss_reduction_sum_option_with_a_token_mean(session_config):
  """loss_reduction="sum" weighs towers by 1: the token mean is still exact."""
  features, labels = sequences()
  fn = token_loss_fn(R.SUM_BY_NONZERO_WEIGHTS)
  one, _ = harness.train(fn, features, labels, 2, session_config)
  many, _ = harness.train(fn, features, labels, 2, session_config,
                          num_towers=2, loss_reduction="sum")
  assert_same(one, many)


def test_token_mean_by_hand_numpy():
  """The reference itself: Σ mask·ce / Σ mask over the global batch."""
  features, labels = sequences()
  with tf.Graph().as_default(), tf1.Session() as session:
    logits = tf.constant(np.random.RandomState(3).randn(7, TIME, VOCAB),
                         tf.float32)
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits,
                                                   weights=features["mask"])
    got, z = session.run([loss, logits])
  log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
  ce = -np.take_along_axis(log_p, labels[..., None], -1)[..., 0]
  mask = features["mask"]
  np.testing.assert_allclose(got, (ce * mask).sum() / mask.sum(), rtol=1e-5)


def lstm_token_loss_fn(features, labels, mode):
  """seq2seq style: embedding, dynamic_rnn LSTM with sequence_length, a
  token-level mean through the padding mask."""
  embeddings = tf1.get_variable(
      "embeddings", [VOCAB, DIM],
      initializer=tf1.random_normal_initializer(seed=1))
  cell = tf1.nn.rnn_cell.LSTMCell(
      6, initializer=tf1.glorot_uniform_initializer(seed=3))
  outputs, _ = tf1.nn.dynamic_rnn(
      cell, tf.nn.embedding_lookup(embeddings, features["tokens"]),
      sequence_length=tf.cast(tf.reduce_sum(features["mask"], 1), tf.int32),
      dtype=tf.float32)
  logits = tf1.layers.dense(outputs, VOCAB, name="out",
                            kernel_initializer=tf1.glorot_uniform_initializer(
                                seed=2))
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits,
                                                 weights=features["mask"])
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op(loss))


@pytest.mark.parametrize("num_towers", [2, 3])
def test_lstm_token_mean_matches_one_device(num_towers, session_config):
  features, labels = sequences()
  one, loss_one = harness.train(lstm_token_loss_fn, features, labels, 2,
                                session_config)
  many, loss_many = harness.train(lstm_token_loss_fn, features, labels, 2,
                                  session_config, num_towers=num_towers)
  np.testing.assert_allclose(loss_many, loss_one, rtol=1e-5)
  assert_same(one, many)


def test_compute_weighted_loss_called_directly(session_config):
  def model_fn(features, labels, mode):
    logits = logits_of(features)
    per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    loss = tf1.losses.compute_weighted_loss(per_token, features["mask"],
                                            reduction=R.MEAN)
    return tf.estimator.EstimatorSpec(mode, loss=loss,
                                      train_op=train_op(loss))

  features, labels = sequences()
  one, _ = harness.train(model_fn, features, labels, 2, session_config)
  many, _ = harness.train(model_fn, features, labels, 2, session_config,
                          num_towers=3)
  assert_same(one, many)


def test_a_per_example_mean_adds_no_collective(session_config):
  """The common case keeps TensorFlow's reduction: no cross-tower traffic."""
  features, labels = sequences()
  with tf.Graph().as_default() as graph:
    tf1.train.get_or_create_global_step()
    harness.call(emg.multi_gpu(token_loss_fn(R.SUM_BY_NONZERO_WEIGHTS,
                                             weighted=False),
                               devices=harness.cpu_devices(2)),
                 tf.nest.map_structure(tf.constant, features),
                 tf.constant(labels), "train", session_config)
  assert not [op for op in graph.get_operations()
              if op.type.startswith("Collective")]
