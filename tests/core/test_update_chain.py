"""The update chain is a list of steps: the options build it, in order, and a
new step is one `UpdateStep` plus its place in the list."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu.update import chain
from estimator_multigpu.update import steps as steps_lib

import harness

tf1 = tf.compat.v1
TRAIN = tf.estimator.ModeKeys.TRAIN
X, Y = harness.linear_data(6, in_dim=3, out_dim=1, seed=5)
W0 = np.array([[0.5], [-0.25], [1.0]], np.float32)
LR = 0.1


def linear_model_fn(features, labels, mode):
  w = tf1.get_variable("w", initializer=W0)
  # float32 whatever the precision (mixed precision casts the features).
  predictions = tf.matmul(tf.cast(features, tf.float32), w)
  loss = tf.reduce_mean(tf.square(predictions - labels))
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(LR))
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
      loss, tf1.train.get_global_step()))


def built_steps(monkeypatch, session_config, **options) -> list:
  """The names of the steps `steps_for` gave the TRAIN graph of 2 towers."""
  built = []
  real = steps_lib.steps_for

  def recording(*args, **kwargs):
    built.append(real(*args, **kwargs))
    return built[-1]

  monkeypatch.setattr(steps_lib, "steps_for", recording)
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    harness.call(emg.multi_gpu(linear_model_fn,
                               devices=harness.cpu_devices(2), **options),
                 tf.constant(X), tf.constant(Y), TRAIN, session_config)
  assert len(built) == 1
  return steps_lib.names(built[0])


@pytest.mark.parametrize("options,names", [
    ({}, []),
    ({"mixed_precision": "bfloat16"}, []),
    ({"clip_gradients_by_norm": 1.0}, ["clip"]),
    ({"accumulate_steps": 2, "clip_gradients_by_norm": 1.0},
     ["accumulate", "clip"]),
    ({"mixed_precision": "float16"}, ["skip_nonfinite", "unscale"]),
    ({"mixed_precision": "float16", "accumulate_steps": 3,
      "clip_gradients_by_norm": 1.0},
     ["skip_nonfinite", "unscale", "accumulate", "clip"]),
])
def test_the_options_build_the_steps_in_order(options, names, monkeypatch,
                                              session_config):
  assert built_steps(monkeypatch, session_config, **options) == names


class CubeGradients(chain.UpdateStep):
  """A toy step: each combined gradient, cubed (elementwise); its spec gets
  a hook. Not linear, so cubing each tower's gradient would differ."""

  name = "cube"

  def __init__(self):
    self.hook = tf1.train.SessionRunHook()

  def transform(self, update) -> list:
    return [(None if g is None else g ** 3, v)
            for g, v in update.grads_and_vars]

  def finish(self, spec, towers, output_dir):
    return spec._replace(
        training_hooks=list(spec.training_hooks) + [self.hook])


def numpy_sgd(steps, clip_norm):
  """One device: the full batch's gradient, clipped to `clip_norm`, then
  cubed, then applied."""
  w = W0.astype(np.float64)
  for _ in range(steps):
    grad = 2.0 / len(X) * X.T @ (X @ w - Y)
    grad *= clip_norm / max(np.sqrt(np.sum(grad ** 2)), clip_norm)
    w -= LR * grad ** 3
  return w


@pytest.mark.parametrize("mode", ["shared", "replicated"])
def test_a_new_step_is_one_class_and_its_place_in_the_list(
    mode, monkeypatch, session_config):
  real = steps_lib.steps_for
  cubes = []

  def with_cube(*args, **kwargs):
    cubes.append(CubeGradients())
    return real(*args, **kwargs) + [cubes[-1]]  # after the clip.

  monkeypatch.setattr(steps_lib, "steps_for", with_cube)
  # The full batch's gradient has norm about 1.9 at first: the clip acts.
  assert np.sqrt(np.sum((2.0 / 6 * X.T @ (X @ W0 - Y)) ** 2)) > 1.5
  values, _ = harness.train(linear_model_fn, X, Y, 3, session_config,
                            num_towers=3, clip_gradients_by_norm=1.5,
                            **harness.VARIABLE_MODES[mode])
  np.testing.assert_allclose(values["w"], numpy_sgd(3, clip_norm=1.5),
                             atol=1e-6)
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    spec = harness.call(emg.multi_gpu(linear_model_fn,
                                      devices=harness.cpu_devices(3)),
                        tf.constant(X), tf.constant(Y), TRAIN, session_config)
  assert cubes[-1].hook in spec.training_hooks
