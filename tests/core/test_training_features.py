"""Batch norm, clipping, SyncReplicasOptimizer, checkpoints and the plan log."""

import logging

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
X, Y = harness.linear_data(6, in_dim=3, out_dim=1, seed=5)
W0 = np.array([[0.5], [-0.25], [1.0]], np.float32)
LR = 0.1


def batch_norm_model_fn(features, labels, mode):
  normed = tf1.layers.batch_normalization(features, momentum=0.9,
                                          training=True)
  w = tf1.get_variable("w", initializer=W0)
  loss = tf.reduce_mean(tf.square(tf.matmul(normed, w) - labels))
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(LR))
  with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
    train_op = opt.minimize(loss, tf1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


@pytest.mark.parametrize("variable_update", ["shared", "replicated"])
@pytest.mark.parametrize("num_towers,tower0_rows", [(1, 6), (2, 3), (4, 2)])
def test_batch_norm_statistics_update_once_per_step(num_towers, tower0_rows,
                                                    variable_update,
                                                    session_config):
  # moving_mean starts at 0 and moves 10% of the way to tower 0's shard mean
  # once per step: after 3 steps it is (1 - 0.9³) · mean(shard 0).
  values, _ = harness.train(batch_norm_model_fn, X, Y, 3, session_config,
                            num_towers=num_towers,
                            variable_update=variable_update)
  shard0 = X[:tower0_rows]
  np.testing.assert_allclose(values["batch_normalization/moving_mean"],
                             (1 - 0.9 ** 3) * shard0.mean(axis=0), atol=1e-6)
  want_variance = 0.9 ** 3 + (1 - 0.9 ** 3) * shard0.var(axis=0, ddof=0)
  np.testing.assert_allclose(values["batch_normalization/moving_variance"],
                             want_variance, rtol=1e-5)


def linear_model_fn(features, labels, mode):
  w = tf1.get_variable("w", initializer=W0)
  loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(LR))
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
      loss, tf1.train.get_global_step()))


def numpy_sgd(steps, clip_norm=None):
  w = W0.astype(np.float64)
  for _ in range(steps):
    grad = 2.0 / len(X) * X.T @ (X @ w - Y)
    if clip_norm is not None:
      grad *= clip_norm / max(np.sqrt(np.sum(grad ** 2)), clip_norm)
    w -= LR * grad
  return w


@pytest.mark.parametrize("mode", list(harness.VARIABLE_MODES))
@pytest.mark.parametrize("num_towers", [1, 3])
def test_clip_gradients_by_norm_clips_the_combined_gradient(num_towers, mode,
                                                            session_config):
  # The unclipped gradient's norm here is about 1.9, so 0.5 really clips.
  assert np.sqrt(np.sum((2.0 / 6 * X.T @ (X @ W0 - Y)) ** 2)) > 1.0
  values, _ = harness.train(linear_model_fn, X, Y, 2, session_config,
                            num_towers=num_towers, clip_gradients_by_norm=0.5,
                            **harness.VARIABLE_MODES[mode])
  np.testing.assert_allclose(values["w"], numpy_sgd(2, clip_norm=0.5),
                             atol=1e-5)


def input_fn():
  return tf.data.Dataset.from_tensors((X, Y)).repeat()


def sync_replicas_model_fn(features, labels, mode):
  w = tf1.get_variable("w", initializer=W0)
  loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
  opt = emg.TowerOptimizer(tf1.train.SyncReplicasOptimizer(
      tf1.train.GradientDescentOptimizer(LR), replicas_to_aggregate=1,
      total_num_replicas=1))
  train_op = opt.minimize(loss, tf1.train.get_global_step())
  return tf.estimator.EstimatorSpec(
      mode, loss=loss, train_op=train_op,
      training_hooks=[opt.make_session_run_hook(is_chief=True)])


def run_sync_replicas(devices, session_config, steps=3):
  """Trains in a MonitoredTrainingSession, as Estimator does, with a short
  grace period: SyncReplicasOptimizer's queue runner stops only at close."""
  with tf.Graph().as_default():
    step = tf1.train.get_or_create_global_step()
    model_fn = (emg.multi_gpu(sync_replicas_model_fn, devices=devices)
                if devices else sync_replicas_model_fn)
    spec = harness.call(model_fn, tf.constant(X), tf.constant(Y), "train",
                        session_config)
    w_var, = [v for v in tf1.global_variables() if v.op.name == "w"]
    with tf1.train.MonitoredTrainingSession(
        hooks=spec.training_hooks, config=session_config,
        stop_grace_period_secs=1) as session:
      for _ in range(steps):
        session.run(spec.train_op)
      return session.run([w_var, step])


def test_sync_replicas_optimizer_inside_the_towers(session_config):
  want_w, want_step = run_sync_replicas(None, session_config)
  w, step = run_sync_replicas(["/cpu:0", "/cpu:1"], session_config)
  # SyncReplicasOptimizer drops the second run's gradient as stale (its
  # local step lags the global step once), so 3 runs apply 2 SGD updates.
  np.testing.assert_allclose(want_w, numpy_sgd(2), atol=1e-5)
  np.testing.assert_allclose(w, numpy_sgd(2), atol=1e-5)
  assert step == want_step == 2


def estimator(model_fn, model_dir, session_config):
  return tf.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(
      str(model_dir), session_config=session_config))


def test_checkpoint_from_4_towers_restores_into_1_and_2(session_config,
                                                        tmp_path):
  four = estimator(emg.multi_gpu(linear_model_fn, devices=harness.cpu_devices(
      4)), tmp_path / "run", session_config)
  four.train(input_fn, max_steps=2)
  reference = estimator(linear_model_fn, tmp_path / "reference",
                        session_config)
  reference.train(input_fn, max_steps=2)
  assert (tf.train.list_variables(four.model_dir) ==
          tf.train.list_variables(reference.model_dir))
  unwrapped = estimator(linear_model_fn, tmp_path / "run", session_config)
  metrics = unwrapped.evaluate(input_fn, steps=1)
  residual = X @ numpy_sgd(2) - Y
  np.testing.assert_allclose(metrics["loss"], np.mean(residual ** 2),
                             rtol=1e-5)
  two = estimator(emg.multi_gpu(linear_model_fn, devices=["/cpu:0", "/cpu:1"]),
                  tmp_path / "run", session_config)
  two.train(input_fn, max_steps=3)
  np.testing.assert_allclose(two.get_variable_value("w"), numpy_sgd(3),
                             atol=1e-5)


def test_plan_is_logged_once_per_graph(session_config, caplog):
  with caplog.at_level(logging.INFO, logger="absl"):
    harness.train(linear_model_fn, X[:5], Y[:5], 1, session_config,
                  num_towers=3)
  lines = [r.getMessage() for r in caplog.records if "multi_gpu train" in
           r.getMessage()]
  assert lines == [
      "multi_gpu train: 3 towers on /cpu:0, /cpu:1, /cpu:2; variables on "
      "/cpu:0; gradients aggregated on /cpu:0; global batch 5 -> per-tower "
      "batch [2, 2, 1]"]


def test_tower_ops_run_on_their_devices(session_config):
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    fn = emg.multi_gpu(linear_model_fn, devices=["/cpu:1", "/cpu:2"],
                       aggregation_device="/cpu:3")
    fn(tf.constant(X), tf.constant(Y), "train", {},
       harness.config_for(session_config))
    graph = tf1.get_default_graph()
    assert graph.get_operation_by_name("w").device == "/device:CPU:3"
    assert graph.get_operation_by_name("MatMul").device == "/device:CPU:1"
    assert graph.get_operation_by_name(
        "tower_1/MatMul").device == "/device:CPU:2"
