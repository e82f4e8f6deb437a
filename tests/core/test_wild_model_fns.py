"""Model_fns written the way popular open-source code writes them.

Each pattern of issue #13 runs on 1 device and on 2 and 3 towers over an
uneven batch of 7 (shards 4 + 3 and 3 + 2 + 2) with the same global batch;
every variable must match the unwrapped model_fn to 1e-5, or the pattern must
be a clear error whose message is checked here. The reference is the
unwrapped model_fn in plain TF, which the library does not touch.
"""

import logging

import bert_like
import numpy as np
import pytest
import tensorflow as tf
import tf_slim as slim

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
BATCH = 7
TOWERS = [2, 3]
X, Y = harness.linear_data(BATCH)
W0 = np.array([[0.1, -0.2], [0.3, 0.05], [-0.4, 0.2]], np.float32)
B0 = np.array([0.01, -0.02], np.float32)
LR = 0.05


def assert_exact(model_fn, num_towers, session_config, features=X, labels=Y,
                 steps=3, **options):
  """Trains 1 device and `num_towers` towers; every variable must agree."""
  want, want_loss = harness.train(model_fn, features, labels, steps,
                                  session_config)
  got, got_loss = harness.train(model_fn, features, labels, steps,
                                session_config, num_towers=num_towers,
                                **options)
  harness.assert_same_variables(got, want)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
  return got


def linear_loss(features, labels):
  w = tf1.get_variable("w", initializer=W0)
  b = tf1.get_variable("b", initializer=B0)
  return tf.reduce_mean(tf.square(tf.matmul(features, w) + b - labels))


def numpy_sgd(steps):
  """SGD on the whole batch: d/dW mean((xW + b - y)²) = 2/(n·2) xᵀ r."""
  w, b = W0.astype(np.float64), B0.astype(np.float64)
  for _ in range(steps):
    residual = X @ w + b - Y
    scale = 2.0 / residual.size
    w, b = w - LR * scale * X.T @ residual, b - LR * scale * residual.sum(0)
  return w, b


def spec(mode, loss, train_op):
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


# Row 1: Google BERT's optimization.create_optimizer, reduced to plain SGD.
def tf_gradients_model_fn(features, labels, mode):
  loss = linear_loss(features, labels)
  tvars = tf1.trainable_variables()
  grads = tf.gradients(loss, tvars)
  grads, _ = tf.clip_by_global_norm(grads, clip_norm=1e6)  # never active.
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(LR))
  train_op = opt.apply_gradients(zip(grads, tvars))
  step = tf1.train.get_global_step()
  return spec(mode, loss, tf.group(train_op, step.assign(step + 1)))


@pytest.mark.parametrize("num_towers", TOWERS)
def test_tf_gradients_clipped_and_a_hand_incremented_step(num_towers,
                                                          session_config):
  got = assert_exact(tf_gradients_model_fn, num_towers, session_config)
  want_w, want_b = numpy_sgd(3)
  np.testing.assert_allclose(got["w"], want_w, atol=1e-5)
  np.testing.assert_allclose(got["b"], want_b, atol=1e-5)
  assert got["global_step"] == 3  # once per step, not once per tower.


# Row 2: the inner optimizer computes, the TowerOptimizer applies.
def inner_compute_model_fn(features, labels, mode):
  loss = linear_loss(features, labels)
  inner = tf1.train.MomentumOptimizer(LR, 0.9)
  grads_and_vars = inner.compute_gradients(loss)
  train_op = emg.TowerOptimizer(inner).apply_gradients(
      grads_and_vars, tf1.train.get_global_step())
  return spec(mode, loss, train_op)


@pytest.mark.parametrize("num_towers", TOWERS + [4])
def test_inner_compute_gradients_then_tower_apply(num_towers,
                                                  session_config):
  got = assert_exact(inner_compute_model_fn, num_towers, session_config)
  assert got["global_step"] == 3


# Row 3: TowerOptimizer(TowerOptimizer(opt)) is TowerOptimizer(opt).
def nested_model_fn(features, labels, mode):
  loss = linear_loss(features, labels)
  opt = emg.TowerOptimizer(emg.TowerOptimizer(
      tf1.train.GradientDescentOptimizer(LR)))
  return spec(mode, loss, opt.minimize(loss, tf1.train.get_global_step()))


@pytest.mark.parametrize("num_towers", TOWERS)
def test_nested_tower_optimizer(num_towers, session_config):
  got = assert_exact(nested_model_fn, num_towers, session_config)
  np.testing.assert_allclose(got["w"], numpy_sgd(3)[0], atol=1e-5)


def test_nested_tower_optimizer_unwraps_once():
  inner = tf1.train.GradientDescentOptimizer(LR)
  nested = emg.TowerOptimizer(emg.TowerOptimizer(
      inner, summarize_gradient_norm=True))
  assert nested._optimizer is inner  # pylint: disable=protected-access
  assert nested._summarize_gradient_norm  # pylint: disable=protected-access


# Row 4: tf_slim.optimize_loss with a learning rate, a decay and summaries.
def optimize_loss_model_fn(features, labels, mode):
  loss = linear_loss(features, labels)
  train_op = slim.optimize_loss(
      loss, tf1.train.get_global_step(), learning_rate=LR,
      optimizer=lambda lr: emg.TowerOptimizer(
          tf1.train.MomentumOptimizer(lr, 0.9)),
      learning_rate_decay_fn=lambda lr, step: tf1.train.exponential_decay(
          lr, step, 100, 0.5),
      summaries=["loss", "learning_rate", "global_gradient_norm"])
  return spec(mode, loss, train_op)


@pytest.mark.parametrize("num_towers", TOWERS)
def test_tf_slim_optimize_loss_with_a_learning_rate(num_towers,
                                                    session_config):
  got = assert_exact(optimize_loss_model_fn, num_towers, session_config)
  assert got["global_step"] == 3
  assert "OptimizeLoss/learning_rate" in got


def test_optimize_loss_with_an_optimizer_name_says_how_to_wrap_it(
    session_config):
  def model_fn(features, labels, mode):
    loss = linear_loss(features, labels)
    return spec(mode, loss, slim.optimize_loss(
        loss, tf1.train.get_global_step(), learning_rate=LR,
        optimizer="SGD"))

  with pytest.raises(ValueError, match=r"does not come from a "
                     r"`TowerOptimizer`.*optimize_loss, pass optimizer=lambda "
                     r"lr: TowerOptimizer\("):
    harness.train(model_fn, X, Y, 1, session_config, num_towers=2)


# Row 5: tf-slim batch_norm on a 2-D input.
def slim_batch_norm_model_fn(features, labels, mode):
  normed = slim.batch_norm(features, decay=0.9, is_training=True)
  loss = linear_loss(normed, labels)
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(LR))
  with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
    train_op = opt.minimize(loss, tf1.train.get_global_step())
  return spec(mode, loss, train_op)


@pytest.mark.parametrize("num_towers,tower0_rows", [(1, 7), (2, 4), (3, 3)])
def test_tf_slim_batch_norm_on_a_2d_input(num_towers, tower0_rows,
                                          session_config):
  values, _ = harness.train(slim_batch_norm_model_fn, X, Y, 3,
                            session_config, num_towers=num_towers)
  # The moving mean moves 10% of the way to tower 0's shard mean per step
  # (the batch statistics of a tower are its shard's, rule 4): (1 - 0.9³)·m.
  np.testing.assert_allclose(values["BatchNorm/moving_mean"],
                             (1 - 0.9 ** 3) * X[:tower0_rows].mean(axis=0),
                             atol=1e-6)


# Row 6: make_parallel without a session_config, run with 4 CPUs.
def test_make_parallel_on_four_cpus_without_a_session_config(session_config):
  x_value = np.arange(10, dtype=np.float32).reshape(5, 2)
  with tf.Graph().as_default():
    x = tf.constant(x_value)
    out = emg.make_parallel(lambda x: 3.0 * x + 1.0,
                            [f"/cpu:{k}" for k in range(4)], x=x)
    with tf1.Session(config=session_config) as session:
      got = session.run(out)
  np.testing.assert_allclose(got, 3.0 * x_value + 1.0)


def test_make_parallel_missing_gpu_never_mentions_a_run_config():
  if tf.config.list_physical_devices("GPU"):
    pytest.skip("this machine has GPUs; the test asks for one it lacks")
  with tf.Graph().as_default(), pytest.raises(ValueError) as raised:
    emg.make_parallel(lambda x: x, ["/gpu:0"], x=tf.zeros([2]))
  message = str(raised.value)
  assert "`make_parallel` `devices` asks for /gpu:0, which this process " \
         "does not see; it sees no GPU." in message
  assert "RunConfig" not in message


# Row 7: a batch of 1 on 4 towers with batch norm.
def batch_norm_model_fn(features, labels, mode):
  normed = tf1.layers.batch_normalization(features, momentum=0.9,
                                          training=True)
  loss = linear_loss(normed, labels)
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(LR))
  with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
    train_op = opt.minimize(loss, tf1.train.get_global_step())
  return spec(mode, loss, train_op)


@pytest.mark.parametrize("dynamic_batch", [False, True])
def test_a_batch_of_one_on_four_towers_with_batch_norm(dynamic_batch,
                                                       session_config):
  # Shards are [1, 0, 0, 0]: the example goes to tower 0, whose UPDATE_OPS
  # are the ones that run, so the moving statistics come from it.
  got = assert_exact(batch_norm_model_fn, 4, session_config, X[:1], Y[:1],
                     dynamic_batch=dynamic_batch)
  # One example: the batch mean is the example, so after 3 steps the
  # moving mean is (1 - 0.9³)·x.
  np.testing.assert_allclose(got["batch_normalization/moving_mean"],
                             (1 - 0.9 ** 3) * X[0], atol=1e-6)


# Row 8: a batch of 0 examples.
def test_an_empty_batch_at_run_time_is_an_error(session_config):
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="The global batch has no examples. On one device "
                     "the loss of an empty batch is NaN"):
    harness.train(tf_gradients_model_fn, X[:0], Y[:0], 1, session_config,
                  num_towers=2, dynamic_batch=True)


def test_an_empty_batch_known_when_building_is_an_error(session_config):
  with pytest.raises(ValueError, match="The global batch has no examples"):
    harness.train(tf_gradients_model_fn, X[:0], Y[:0], 1, session_config,
                  num_towers=2)


# Row 9: a feature that is not batch-major (a vocabulary) of length 7.
VOCAB = np.linspace(-1.0, 1.0, BATCH).astype(np.float32)


def vocab_model_fn(features, labels, mode):
  # Every example is scored against the whole vocabulary.
  offset = tf.reduce_mean(features["vocab"])
  loss = linear_loss(features["x"] + offset, labels)
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(LR))
  return spec(mode, loss, opt.minimize(loss, tf1.train.get_global_step()))


@pytest.mark.parametrize("num_towers", TOWERS)
def test_unsplit_features_reach_every_tower_whole(num_towers,
                                                  session_config):
  features = {"x": X + 1.0, "vocab": VOCAB + 1.0}  # mean(vocab) = 1.
  assert_exact(vocab_model_fn, num_towers, session_config, features,
               unsplit_features=["vocab"])


@pytest.mark.parametrize("features,unsplit,error,match", [
    (X, ["vocab"], TypeError, r"`unsplit_features`=\['vocab'\] names feature "
     r"keys, but the features are a \w*Tensor, not a dict"),
    ({"x": X}, ["vocab"], ValueError, r"`unsplit_features` names \['vocab'\],"
     r" which the features do not have; they have \['x'\]"),
])
def test_unsplit_features_mistakes(features, unsplit, error, match,
                                   session_config):
  with pytest.raises(error, match=match):
    harness.train(vocab_model_fn, features, Y, 1, session_config,
                  num_towers=2, unsplit_features=unsplit)


def test_unsplit_features_must_be_a_list_of_keys():
  with pytest.raises(TypeError, match="`unsplit_features` must be a list of "
                     "feature keys .*got 'vocab'"):
    emg.multi_gpu(vocab_model_fn, unsplit_features="vocab")


def test_a_mismatched_feature_length_suggests_unsplit_features(
    session_config):
  features = {"x": X, "vocab": VOCAB[:5]}
  with pytest.raises(ValueError, match=r"`features\['vocab'\]` has 5.*name "
                     r"features that are not batch-major .*unsplit_features"):
    harness.train(vocab_model_fn, features, Y, 1, session_config,
                  num_towers=2)


# Row 10: RaggedTensor features.
def test_ragged_features_are_a_clear_error(session_config):
  def ragged():
    return {"x": tf.constant(X), "tokens": tf.ragged.constant(
        [[1], [2, 3], [], [4], [5, 6, 7], [8], [9]])}

  with pytest.raises(TypeError, match=r"`features\['tokens'\]` is a "
                     r"tf.RaggedTensor.*`.to_tensor\(\)`.*`.to_sparse\(\)`"):
    harness.train(vocab_model_fn, ragged, Y, 1, session_config, num_towers=2)


# Row 11: a scalar prediction.
def test_a_scalar_prediction_is_a_clear_error_naming_its_key(session_config):
  def model_fn(features, labels, mode):
    logits = tf1.layers.dense(features, 2)
    return tf.estimator.EstimatorSpec(mode, predictions={
        "logits": logits, "temperature": tf.constant(1.0)})

  with tf.Graph().as_default(), pytest.raises(
      ValueError, match=r"The model_fn's `predictions\['temperature'\]` is a "
      r"scalar; .*Return one value per example"):
    harness.call(emg.multi_gpu(model_fn, devices=harness.cpu_devices(2)),
                 tf.constant(X), None, "infer", session_config)


# Clipping by global norm inside the towers: a warning with the fix.
def test_clip_by_global_norm_in_the_model_fn_warns_once(session_config,
                                                        caplog):
  with caplog.at_level(logging.WARNING, logger="absl"):
    harness.train(tf_gradients_model_fn, X, Y, 1, session_config,
                  num_towers=3)
  warnings = [r.getMessage() for r in caplog.records
              if "clip_by_global_norm" in r.getMessage()]
  assert len(warnings) == 1  # once, not once per tower.
  assert "pass multi_gpu(..., clip_gradients_by_norm=" in warnings[0]


# A BERT-style model_fn (tests/bert_like.py): tf.gradients, clipping, an
# AdamWeightDecay optimizer that leaves global_step alone, a hand-incremented
# step, and a TPUEstimatorSpec.
def bert_model_fn(**params):
  return lambda features, labels, mode: bert_like.model_fn(
      features, labels, mode, params)


@pytest.mark.parametrize("num_towers", TOWERS)
def test_bert_style_model_fn(num_towers, session_config):
  # BERT clips at 1.0; a loose clip keeps the ops but never binds, so the
  # towers must match one device exactly (a binding clip: next test).
  got = assert_exact(bert_model_fn(clip_norm=1e6), num_towers,
                     session_config, bert_like.features(BATCH), None)
  assert got["global_step"] == 3
  assert "bert/embeddings/word_embeddings/adam_m" in got


@pytest.mark.parametrize("num_towers", [3])
def test_bert_clipping_moved_to_the_wrapper_is_exact(num_towers,
                                                     session_config):
  features = bert_like.features(BATCH)
  want, _ = harness.train(bert_model_fn(clip_norm=0.05), features, None, 3,
                          session_config)
  unclipped, _ = harness.train(bert_model_fn(), features, None, 3,
                               session_config)
  got, _ = harness.train(bert_model_fn(), features, None, 3, session_config,
                         num_towers=num_towers, clip_gradients_by_norm=0.05)
  # The clip binds: without it one device ends elsewhere.
  assert np.max(np.abs(unclipped["output_bias"] - want["output_bias"])) > 1e-3
  for name in want:
    np.testing.assert_allclose(got[name], want[name], atol=1e-5,
                               err_msg=name)


def evaluate(model_fn, features, session_config):
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    spec = harness.call(model_fn, tf.nest.map_structure(tf.constant, features),
                        None, "eval", session_config)
    if hasattr(spec, "as_estimator_spec"):  # as TPUEstimator(use_tpu=False).
      spec = spec.as_estimator_spec()
    with tf1.Session(config=session_config) as session:
      session.run([tf1.global_variables_initializer(),
                   tf1.local_variables_initializer()])
      session.run({k: u for k, (_, u) in spec.eval_metric_ops.items()})
      return session.run({k: v for k, (v, _) in spec.eval_metric_ops.items()})


@pytest.mark.parametrize("num_towers", TOWERS)
def test_bert_style_eval_metrics_cover_every_shard(num_towers,
                                                   session_config):
  features = bert_like.features(BATCH, seed=1)
  want = evaluate(bert_model_fn(), features, session_config)
  got = evaluate(emg.multi_gpu(bert_model_fn(), devices=harness.cpu_devices(
      num_towers)), features, session_config)
  assert sorted(got) == ["eval_accuracy", "eval_loss"]
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=1e-5)
