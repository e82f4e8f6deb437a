"""`mixed_precision`: float32 masters, low-precision towers, float16 loss scale.

The linear model is pred = x @ W, loss = mean((pred - y)²); its gradient is
dW = 2/(n·2) · xᵀ(pred - y). bfloat16 keeps 8 significant bits (relative
error ≤ 2⁻⁸ ≈ 0.4% per rounding), float16 11 bits, so updates are compared
with numpy's float64 ones to a tolerance that covers those roundings.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu.update import loss_scaling

import classifier
import datasets
import harness

tf1 = tf.compat.v1
TRAIN = tf.estimator.ModeKeys.TRAIN
W0 = np.array([[0.1, -0.2], [0.3, 0.05], [-0.4, 0.2]], np.float32)
LR = 0.05


def linear_model_fn(seen_dtypes=None, optimizer=None):
  def model_fn(features, labels, mode):
    if seen_dtypes is not None:
      seen_dtypes.append(features.dtype)
    w = tf1.get_variable("w", shape=W0.shape, dtype=features.dtype,
                         initializer=tf1.constant_initializer(W0))
    pred = tf.matmul(features, w)
    loss = tf.reduce_mean(tf.square(tf.cast(pred, tf.float32) - labels))
    opt = emg.TowerOptimizer(optimizer() if optimizer else
                             tf1.train.GradientDescentOptimizer(LR))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
        loss, tf1.train.get_global_step()))
  return model_fn


def numpy_gradient(x, y, w):
  residual = x @ w - y
  return 2.0 / residual.size * x.T @ residual


def test_bfloat16_towers_float32_masters(session_config):
  # One SGD step: W1 = W0 - LR·dW. Rounding x, W and the products to
  # bfloat16 changes dW by well under 1%; |LR·dW| < 0.1 here, so 1e-3 holds.
  x, y = harness.linear_data(8)
  seen = []
  values, loss = harness.train(linear_model_fn(seen), x, y, 1, session_config,
                               num_towers=2, mixed_precision="bfloat16")
  assert seen == [tf.bfloat16, tf.bfloat16]  # each tower computes in bf16.
  assert values["w"].dtype == np.float32  # the master, unwrapped name.
  assert sorted(values) == ["global_step", "w"]
  want = W0 - LR * numpy_gradient(x, y, W0)
  np.testing.assert_allclose(values["w"], want, atol=1e-3)
  assert np.abs(values["w"] - W0).max() > 1e-2  # the step is real.
  np.testing.assert_allclose(loss, np.mean((x @ W0 - y) ** 2), rtol=1e-2)


def test_one_tower_keras_layer_gets_the_mixed_policy(session_config):
  # A Keras layer built inside the model_fn follows TF's mixed policy:
  # float32 kernel, bfloat16 output.
  x, y = harness.linear_data(4)
  outputs = []

  def model_fn(features, labels, mode):
    dense = tf.keras.layers.Dense(2, name="lin")
    pred = dense(features)
    outputs.append(pred.dtype)
    loss = tf.reduce_mean(tf.square(tf.cast(pred, tf.float32) - labels))
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(LR))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
        loss, tf1.train.get_global_step()))

  values, _ = harness.train(model_fn, x, y, 1, session_config, num_towers=1,
                            mixed_precision="bfloat16")
  assert outputs == [tf.bfloat16]
  assert values["lin/kernel"].dtype == np.float32


def fed_batches(xs, ys, model_fn, session_config, runs, num_towers=2,
                **options):
  """Runs the train_op once per batch, Estimator-style (with its hooks);
  returns every global and loss-scale variable after each run."""
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    dataset = tf.data.Dataset.from_tensor_slices((np.stack(xs),
                                                  np.stack(ys)))
    features, labels = tf1.data.make_one_shot_iterator(
        dataset.repeat()).get_next()
    fn = emg.multi_gpu(model_fn, devices=harness.cpu_devices(num_towers),
                       mixed_precision="float16", **options)
    spec = harness.call(fn, features, labels, TRAIN, session_config)
    watched = tf1.global_variables() + [
        v for v in tf1.local_variables() if v.op.name.startswith("loss_scale")]
    history = []
    with tf1.train.SingularMonitoredSession(
        hooks=spec.training_hooks, config=session_config) as session:
      for _ in range(runs):
        session.run(spec.train_op)
        history.append({v.op.name: session.raw_session().run(v)
                        for v in watched})
    return history


def test_float16_skips_exactly_the_overflowing_step(session_config, caplog):
  # Batch 2 is x·300: its residuals reach ~10², times the 2¹⁵ loss scale
  # that is > 65504, so float16 gradients overflow. That step must change
  # nothing (weights, Momentum slots, EMA, global_step) and halve the scale;
  # steps 1 and 3 are two Momentum steps on batch 1 (numpy, float16
  # tolerance).
  x, y = harness.linear_data(8)
  momentum = lambda: tf1.train.MomentumOptimizer(LR, 0.9)
  with caplog.at_level(logging.WARNING):
    history = fed_batches([x, 300 * x, x], [y, y, y],
                          linear_model_fn(optimizer=momentum),
                          session_config, 3, ema_decay=0.9)
  first, skipped, last = history
  assert set(first) == set(skipped)
  for name in first:
    if not name.startswith("loss_scale"):
      np.testing.assert_array_equal(skipped[name], first[name], err_msg=name)
  assert first["loss_scale/current_loss_scale"] == 2.0 ** 15
  assert skipped["loss_scale/current_loss_scale"] == 2.0 ** 14
  assert [h["loss_scale/skipped_updates"] for h in history] == [0, 1, 1]
  assert [h["global_step"] for h in history] == [1, 1, 2]
  assert "update was skipped" in caplog.text
  g1 = numpy_gradient(x, y, W0)
  w1 = W0 - LR * g1
  w2 = w1 - LR * (0.9 * g1 + numpy_gradient(x, y, w1))
  np.testing.assert_allclose(first["w"], w1, atol=2e-3)
  np.testing.assert_allclose(last["w"], w2, atol=2e-3)


def test_float16_overflow_in_one_micro_batch_skips_the_update(
    session_config):
  # accumulate_steps=2 over batches [x, 300x] then [x, x]: the first update
  # holds an overflowing micro-batch and is skipped whole; the second is
  # one SGD step on x (the mean of two equal micro-batches).
  x, y = harness.linear_data(8)
  history = fed_batches([x, 300 * x, x, x], [y] * 4, linear_model_fn(),
                        session_config, 2, accumulate_steps=2)
  np.testing.assert_array_equal(history[0]["w"], W0)
  assert [h["global_step"] for h in history] == [0, 1]
  np.testing.assert_allclose(history[1]["w"],
                             W0 - LR * numpy_gradient(x, y, W0), atol=2e-3)


def test_float16_overflow_at_loss_scale_1_stops_training(session_config):
  # 1e4·x overflows float16 even unscaled: residuals ~5·10³ give
  # dpred ~ 2·5·10³/16 and dW = xᵀ·dpred ~ 10⁴·6·10² > 65504. After 15
  # halvings from 2¹⁵ the scale is 1 and the 16th skip stops training.
  x, y = harness.linear_data(8)
  with pytest.raises(loss_scaling.NonFiniteGradientsError,
                     match="loss scale 1"):
    fed_batches([1e4 * x], [y], linear_model_fn(), session_config, 20)


def test_unknown_mixed_precision_is_a_clear_error():
  with pytest.raises(ValueError, match="`mixed_precision` is 'fp16'"):
    emg.multi_gpu(linear_model_fn(), mixed_precision="fp16")


def test_lenet_digits_bfloat16_accuracy(run_config):
  # LeNet on scikit-learn's 8x8 digits, 2 CPU towers computing in bfloat16,
  # 150 Momentum steps of 32 with a cosine-decayed rate: held-out accuracy
  # must reach 0.95 (bfloat16 convolutions are slow on this CPU).
  config = classifier.ClassifierConfig(
      model_name="lenet", num_classes=10, learning_rate=0.05,
      learning_rate_decay_type="cosine", decay_steps=150)
  estimator = tf.estimator.Estimator(
      emg.multi_gpu(classifier.model_fn, devices=["/cpu:0", "/cpu:1"],
                    mixed_precision="bfloat16"),
      config=run_config, params={"classifier": config})
  estimator.train(datasets.make_input_fn("digits", "train", 32, seed=1),
                  max_steps=150)
  metrics = estimator.evaluate(datasets.make_input_fn("digits", "eval", 256))
  assert metrics["accuracy"] >= 0.95, metrics
  assert estimator.get_variable_value("LeNet/conv1/weights").dtype == (
      np.float32)


def test_float16_with_gradients_not_from_compute_gradients_is_an_error(
    session_config):
  """float16 unscales the combined gradients by the loss scale; gradients of
  the unscaled loss (tf.gradients, BERT-style) would come out 2^15 times too
  small, so they are refused when the graph is built."""
  x, y = harness.linear_data(4)

  def model_fn(features, labels, mode):
    w = tf1.get_variable("w", shape=W0.shape, dtype=features.dtype,
                         initializer=tf1.constant_initializer(W0))
    loss = tf.reduce_mean(tf.square(
        tf.cast(tf.matmul(features, w), tf.float32) - labels))
    grads = tf.gradients(loss, [w])
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(LR))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=(
        opt.apply_gradients(zip(grads, [w]), tf1.train.get_global_step())))

  with pytest.raises(ValueError, match="did not come straight from "
                     "`TowerOptimizer.compute_gradients`"):
    harness.train(model_fn, x, y, 1, session_config, num_towers=2,
                  mixed_precision="float16")
