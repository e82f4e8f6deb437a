"""`accumulate_steps` with a loss normalized by a count of the batch (#30).

A token-level mean (`tf.compat.v1.losses` with `weights=mask`, or
`global_ratio`) over micro-batches with different token counts: the update
must be one device's on the whole accumulated batch (normalizer: all its
tokens), to 1e-5 against the unwrapped model_fn on that batch in plain TF.
Micro-batches: 10 = 5 + 5 on 2 towers, 4 + 4 + 2 on 3 towers. A loss mixing
a token mean with a per-example mean warns.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
RNG = np.random.RandomState(5)
X = RNG.randn(10, 4, 3).astype(np.float32)
Y = RNG.randn(10, 4).astype(np.float32)
# Tokens per example: 1..4, so micro-batches hold different token counts.
MASK = (np.arange(4)[None, :] < np.array(
    [1, 4, 2, 4, 4, 1, 3, 1, 2, 4])[:, None]).astype(np.float32)
W0 = np.array([0.2, -0.3, 0.5], np.float32)


def token_model_fn(normalizer, extra_example_mean=False):
  def model_fn(features, labels, mode):
    w = tf1.get_variable("w", initializer=W0)
    pred = tf.tensordot(features["x"], w, 1)
    mask = features["mask"]
    if normalizer == "losses":
      loss = tf1.losses.mean_squared_error(labels, pred, weights=mask)
    else:
      loss = emg.global_ratio(tf.reduce_sum(tf.square(pred - labels) * mask),
                              tf.reduce_sum(mask))
    if extra_example_mean:
      loss += tf.reduce_mean(tf.square(pred[:, 0]))
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
    return tf.estimator.EstimatorSpec(
        mode, loss=loss,
        train_op=opt.minimize(loss, tf1.train.get_global_step()))
  return model_fn


def train_accumulated(model_fn, micro_batch, updates, session_config,
                      num_towers, **options):
  """`updates` steps, each k micro-batches (the spec's hooks run them)."""
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    dataset = tf.data.Dataset.from_tensor_slices(
        ({"x": X, "mask": MASK}, Y)).batch(micro_batch)
    features, labels = tf1.data.make_one_shot_iterator(
        dataset.repeat()).get_next()
    fn = emg.multi_gpu(model_fn, devices=harness.cpu_devices(num_towers),
                       **options)
    spec = harness.call(fn, features, labels, harness.TRAIN, session_config)
    with tf1.train.SingularMonitoredSession(
        hooks=spec.training_hooks, config=session_config) as session:
      losses = [session.run([spec.loss, spec.train_op])[0]
                for _ in range(updates)]
      return session.raw_session().run(tf1.global_variables()[1]), losses


def numpy_token_mean_sgd(steps):
  """SGD on Σ mask·(x·w - y)² / Σ mask over the 10 examples (26 tokens)."""
  w = W0.astype(np.float64)
  for _ in range(steps):
    residual = (X @ w - Y) * MASK
    w = w - 0.1 * 2 * np.einsum("et,etd->d", residual, X) / MASK.sum()
  return w


@pytest.mark.parametrize("normalizer", ["losses", "global_ratio"])
@pytest.mark.parametrize("num_towers, micro_batch, k",
                         [(2, 5, 2), (3, 4, 3)])
def test_token_mean_is_over_the_accumulated_batch(normalizer, num_towers,
                                                  micro_batch, k,
                                                  session_config):
  want, want_loss = harness.train(token_model_fn(normalizer),
                                  {"x": X, "mask": MASK}, Y, 2,
                                  session_config)
  got, losses = train_accumulated(token_model_fn(normalizer), micro_batch, 2,
                                  session_config, num_towers,
                                  accumulate_steps=k)
  np.testing.assert_allclose(got, want["w"], atol=1e-5)
  np.testing.assert_allclose(got, numpy_token_mean_sgd(2), atol=1e-5)
  np.testing.assert_allclose(losses[0], want_loss, rtol=1e-5)


def test_mixed_normalizers_warn(caplog, session_config):
  with caplog.at_level(logging.WARNING, logger="absl"):
    train_accumulated(token_model_fn("global_ratio", True), 5, 1,
                      session_config, 2, accumulate_steps=2)
  assert "not normalized by them" in caplog.text
