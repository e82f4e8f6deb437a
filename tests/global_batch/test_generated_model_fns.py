"""Property: a model_fn composed at random from the op table's families
(elementwise, contractions crossing the batch, reductions and softmax over
every axis, joins and slices along the batch, sort, statistics, py_func)
trains to one device's variables on 2 and 3 towers, uneven batches."""

import hypothesis
from hypothesis import strategies as st
import numpy as np
import tensorflow as tf

import estimator_multigpu as emg

from tests import harness
from tests.global_batch import cases

tf1 = tf.compat.v1


def _centered(h):
  return h - tf.reduce_mean(h, 0, keepdims=True)


def _standardized(h):
  mean, var = tf.nn.moments(h, [0], keepdims=True)
  return (h - mean) * tf.math.rsqrt(var + 1.0)


def _crossed(h):
  return tf.matmul(tf.nn.softmax(tf.matmul(h, h, transpose_b=True)), h)


def _einsum_crossed(h):
  return tf.einsum("ij,jk->ik", tf.einsum("ik,jk->ij", h, h) * 0.1, h)


def _softmax_batch(h):
  return tf.nn.softmax(h, axis=0) * tf.cast(tf.shape(h)[0], tf.float32)


def _softmax_features(h):
  return tf.nn.softmax(h, axis=-1)


def _sorted(h):
  return tf.sort(h, axis=0) * 0.5 + h * 0.5


def _reversed_joined(h):
  joined = tf.concat([h, tf.reverse(h, [0])], 0)
  return joined[:tf.shape(h)[0]] + joined[tf.shape(h)[0]:]


def _rolled(h):
  return h + tf.roll(h, 1, 0)


def _scaled_by_max(h):
  return h / (tf.reduce_max(tf.abs(h), 0) + 1.0)


def _py_func_centered(h):
  shifted = tf.numpy_function(lambda a: (a - a.mean(0)).astype(np.float32),
                              [h], tf.float32)
  shifted.set_shape(h.shape)
  return h + tf.stop_gradient(shifted)


def _tanh(h):
  return tf.tanh(h) * 2.0 + 0.1


FAMILIES = [_centered, _standardized, _crossed, _einsum_crossed,
            _softmax_batch, _softmax_features, _sorted, _reversed_joined,
            _rolled, _scaled_by_max, _py_func_centered, _tanh]


def _model_fn(steps):
  def loss_of(z1, z2, labels):
    h = z1
    for step in steps:
      h = step(h)
    target = tf.cast(labels[:, None], tf.float32) + z2
    return tf.reduce_mean(tf.square(h - target))
  return loss_of


@hypothesis.settings(max_examples=8, deadline=None, derandomize=True,
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(steps=st.lists(st.sampled_from(FAMILIES), min_size=1,
                                 max_size=3),
                  towers=st.sampled_from([2, 3]),
                  batch=st.sampled_from([2, 5, 7]))
def test_generated_model_fns_train_as_one_device(steps, towers, batch):
  session_config = emg.make_session_config(num_cpus=4)
  loss_of = _model_fn(steps)
  features, labels = cases.data(batch, seed=len(steps) + batch)
  # Fed, not constants: TF 2.15's constant folding pushes the labels'
  # [batch, 1] constant into the BiasAdd before it (a grappler bug that
  # fails the one-device run; the package is not involved).
  want, want_loss = harness.train(cases.train_model_fn(loss_of), features,
                                  labels, 1, session_config,
                                  dynamic_batch=True)
  got, got_loss = harness.train(
      cases.train_model_fn(loss_of, emg.TowerOptimizer), features, labels, 1,
      session_config, num_towers=towers, dynamic_batch=True,
      global_batch=True)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5, atol=1e-6)
  harness.assert_same_variables(got, want, atol=1e-5)
