"""Keras 2 legacy optimizers in `TowerOptimizer` (issue 32).

A model_fn using `tf.keras.optimizers.legacy.*` through `get_updates`,
`get_gradients` + `apply_gradients` or `minimize`, wrapped in
`TowerOptimizer`, trains on 2 and 3 towers like the same model_fn on one
device: every variable (weights, slots, hyperparameters, `iterations`,
global_step) to 1e-5, with the same names. The reference is the same model_fn
unwrapped (outside `multi_gpu`, `TowerOptimizer` is the optimizer it wraps),
from the same constant initial values, on 7 examples (uneven shards: 4/3 and
3/2/2). Non-legacy optimizers and strategies that apply per tower are clear
errors.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu import compat

import harness

tf1 = tf.compat.v1
legacy = tf.keras.optimizers.legacy
X, Y = harness.linear_data(7)
W0 = np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(3, 2)

OPTIMIZERS = {
    "Adam": lambda: legacy.Adam(0.1),  # reads `iterations` every step.
    "Adagrad": lambda: legacy.Adagrad(0.1),
    "SGD_clipped": lambda: legacy.SGD(0.1, momentum=0.5, global_clipnorm=0.3),
}


def _variables():
  w = tf1.get_variable("w", initializer=W0)
  b = tf1.get_variable("b", initializer=tf.zeros([2]))
  return [w, b]


def _loss(features, labels, variables):
  w, b = variables
  return tf.reduce_mean(tf.square(tf.matmul(features, w) + b - labels))


def model_fn_for(optimizer_name, path):
  """A model_fn training with one Keras optimizer through `path`."""

  def model_fn(features, labels, mode):
    variables = _variables()
    loss = _loss(features, labels, variables)
    opt = emg.TowerOptimizer(OPTIMIZERS[optimizer_name]())
    global_step = tf1.train.get_global_step()
    if path == "get_updates":  # the canned estimators' way.
      opt.iterations = global_step
      train_op = opt.get_updates(loss, variables)[0]
    else:
      if path == "minimize":
        update = opt.minimize(
            lambda: _loss(features, labels, variables), variables)
      else:
        grads = opt.get_gradients(loss, variables)
        update = opt.apply_gradients(zip(grads, variables))
      train_op = tf.group(update, global_step.assign_add(1))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  return model_fn


@pytest.mark.parametrize("num_towers", [2, 3])
@pytest.mark.parametrize("path", ["get_updates", "minimize",
                                  "apply_gradients"])
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_towers_train_like_one_device(session_config, optimizer_name, path,
                                      num_towers):
  model_fn = model_fn_for(optimizer_name, path)
  one, _ = harness.train(model_fn, X, Y, 3, session_config)
  many, _ = harness.train(model_fn, X, Y, 3, session_config,
                          num_towers=num_towers)
  assert sorted(many) == sorted(one)
  assert one["global_step"] == many["global_step"] == 3
  assert set(one) - {"w", "b", "global_step"}  # slots, iterations too.
  for name, value in one.items():
    np.testing.assert_allclose(many[name], value, rtol=1e-5, atol=1e-5,
                               err_msg=name)
  assert not np.allclose(one["w"], W0)  # it trained.


def test_wrapper_is_a_legacy_keras_optimizer():
  inner = legacy.Adagrad(0.1)
  opt = emg.TowerOptimizer(emg.TowerOptimizer(inner))  # twice is once.
  assert isinstance(opt, legacy.Optimizer)
  assert opt.wrapped is inner
  assert opt.get_config() == inner.get_config()
  opt.learning_rate = 0.5  # hyperparameters are the wrapped optimizer's.
  assert inner.get_config()["learning_rate"] == 0.5


def test_non_legacy_keras_optimizer_names_the_legacy_class():
  with pytest.raises(TypeError, match=r"tf\.keras\.optimizers\.legacy\."
                     r"Adagrad\(\.\.\.\) with the same arguments"):
    emg.TowerOptimizer(tf.keras.optimizers.Adagrad(0.1))


def test_a_keras_optimizer_without_legacy_class_lists_them():
  with pytest.raises(TypeError, match=r"legacy\.\{Adadelta, Adagrad, Adam, "
                     r".*\(there is no legacy AdamW\)"):
    emg.TowerOptimizer(tf.keras.optimizers.AdamW(0.1))


@pytest.mark.skipif(compat.tensorflow_version() < (2, 16),
                    reason="Keras 3 comes with TF >= 2.16")
def test_keras_3_optimizer_names_the_legacy_class():
  keras = pytest.importorskip("keras")
  if not keras.__version__.startswith("3"):
    pytest.skip(f"keras {keras.__version__} is not Keras 3")
  with pytest.raises(TypeError, match=r"a Keras 3 optimizer.*tf\.keras\."
                     r"optimizers\.legacy\.SGD\(\.\.\.\)"):
    emg.TowerOptimizer(keras.optimizers.SGD(0.1))


def test_not_an_optimizer():
  with pytest.raises(TypeError, match="wraps a `tf.compat.v1.train.Optimizer`"
                     " .* or a `tf.keras.optimizers.legacy.Optimizer`"):
    emg.TowerOptimizer("Adagrad")


def test_unwrapped_keras_optimizer_on_towers_is_an_error(session_config):
  def model_fn(features, labels, mode):
    variables = _variables()
    loss = _loss(features, labels, variables)
    train_op = legacy.SGD(0.1).get_updates(loss, variables)[0]
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  with pytest.raises(ValueError, match="TowerOptimizer.*tf.keras.optimizers"
                     ".legacy"):
    harness.train(model_fn, X, Y, 1, session_config, num_towers=2)


@pytest.mark.parametrize("options", [{"variable_update": "replicated"},
                                     {"synchronization": "async"}])
def test_strategies_applying_per_tower_refuse_keras(session_config, options):
  with pytest.raises(ValueError, match="Keras optimizer \\(Adagrad\\).*"
                     "variable_update='shared'"):
    harness.train(model_fn_for("Adagrad", "get_updates"), X, Y, 1,
                  session_config, num_towers=2, **options)
