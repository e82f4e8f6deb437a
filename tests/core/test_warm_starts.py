"""Warm starts as the model_fn writes them, on every tower (#52 row 3).

A pretrained checkpoint holds `backbone/w` (3 x 1) = W_CKPT. The model is
y = x @ backbone/w + head/b (squared error, gradient descent, learning rate
LR) on 7 examples: shards 4 + 3 and 3 + 2 + 2. After one step from W_CKPT
the weights are numpy's `numpy_step(W_CKPT)`; from its own initializer
(W_OWN) `numpy_step(W_OWN)`.

- `tf.compat.v1.train.init_from_checkpoint` after the layers restores in
  every tower, shared or replicated (the copies start from tower 0's
  restored values).
- Called before the layers, it finds no variable on one device and restores
  nothing: the towers restore nothing either (tower 0's call is one
  device's; towers 1.. must not restore what tower 0 made), and a warning
  says the call found no variables.
- A Scaffold `init_fn` that restores with a `Saver` (Object Detection's
  fine-tune checkpoint): replicated copies start from the restored values.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
LR = 0.1
_RNG = np.random.RandomState(1852)
X = _RNG.randn(7, 3).astype(np.float32)
Y = _RNG.randn(7, 1).astype(np.float32)
W_CKPT = np.array([[1.5], [-0.5], [0.25]], np.float32)
W_OWN = np.array([[0.1], [0.2], [0.3]], np.float32)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("pretrained") / "model.ckpt")
  with tf.Graph().as_default():
    w = tf1.get_variable("backbone/w", initializer=W_CKPT)
    with tf1.Session() as session:
      session.run(w.initializer)
      tf1.train.Saver([w]).save(session, path)
  return path


def numpy_step(w):
  residual = X @ w - Y  # head/b starts at 0.
  return (w - LR * 2.0 * X.T @ residual / len(X),
          -LR * 2.0 * residual.sum(0) / len(X))


def model_fn_for(pretrained, style):
  def model_fn(features, labels, mode):
    if style == "before_layers":
      tf1.train.init_from_checkpoint(pretrained, {"backbone/": "backbone/"})
    w = tf1.get_variable("backbone/w", initializer=W_OWN)
    b = tf1.get_variable("head/b", initializer=np.zeros([1], np.float32))
    scaffold = None
    if style == "after_layers":
      tf1.train.init_from_checkpoint(pretrained, {"backbone/": "backbone/"})
    elif style == "init_fn":
      saver = tf1.train.Saver({"backbone/w": w})
      scaffold = tf1.train.Scaffold(
          init_fn=lambda _, session: saver.restore(session, pretrained))
    loss = tf.reduce_mean(tf.square(tf.matmul(features, w) + b - labels))
    train_op = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(
        LR)).minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                      scaffold=scaffold)
  return model_fn


def _train_one_step(model_fn, model_dir, num_towers=None, **options):
  if num_towers:
    model_fn = emg.multi_gpu(model_fn, devices=harness.cpu_devices(
        num_towers), **options)
  estimator = tf.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(
      str(model_dir), session_config=emg.make_session_config(4)))
  estimator.train(lambda: tf.data.Dataset.from_tensors((X, Y)).repeat(),
                  steps=1)
  return {name: estimator.get_variable_value(name)
          for name in ("backbone/w", "head/b")}


def _assert_values(got, w_start):
  w, b = numpy_step(w_start)
  np.testing.assert_allclose(got["backbone/w"], w, atol=1e-5)
  np.testing.assert_allclose(got["head/b"], b, atol=1e-5)


@pytest.mark.parametrize("num_towers,variable_update", [
    (None, "shared"), (2, "shared"), (3, "replicated")])
def test_init_from_checkpoint_after_the_layers(pretrained, tmp_path,
                                               num_towers, variable_update):
  got = _train_one_step(model_fn_for(pretrained, "after_layers"), tmp_path,
                        num_towers, **({"variable_update": variable_update}
                                       if num_towers else {}))
  _assert_values(got, W_CKPT)


@pytest.mark.parametrize("num_towers", [None, 2, 3])
def test_init_from_checkpoint_before_the_layers_restores_nothing(
    pretrained, tmp_path, caplog, num_towers):
  with caplog.at_level(logging.WARNING, logger="absl"):
    got = _train_one_step(model_fn_for(pretrained, "before_layers"), tmp_path,
                          num_towers)
  _assert_values(got, W_OWN)
  if num_towers:
    assert caplog.text.count("init_from_checkpoint") == 1, caplog.text
    assert "'backbone/'" in caplog.text and "no variable" in caplog.text


@pytest.mark.parametrize("num_towers", [None, 2, 3])
def test_scaffold_init_fn_restore_with_copies_per_tower(pretrained, tmp_path,
                                                        num_towers):
  got = _train_one_step(model_fn_for(pretrained, "init_fn"), tmp_path,
                        num_towers, **({"variable_update": "replicated"}
                                       if num_towers else {}))
  _assert_values(got, W_CKPT)
