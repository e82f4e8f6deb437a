"""synchronization="async": every tower applies its own gradient."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
LR = 0.1


def mean_loss_model_fn(rows_of):
  """loss = mean over the tower's examples of rows_of(x)·w: its gradient,
  the mean of rows_of(x), does not depend on w, so the order of the towers'
  updates and of their reads does not change the result."""
  def model_fn(features, labels, mode):
    del labels
    w = tf1.get_variable("w", [3], initializer=tf1.zeros_initializer())
    loss = tf.reduce_mean(tf.tensordot(rows_of(features), w, 1))
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(LR))
    return tf.estimator.EstimatorSpec(
        mode, loss=loss,
        train_op=opt.minimize(loss, tf1.train.get_global_step()))
  return model_fn


linear_model_fn = mean_loss_model_fn(lambda x: x)
# |x - mean(x)|: the mean is the batch's, a statistic coupling the examples.
centered_model_fn = mean_loss_model_fn(
    lambda x: tf.abs(x - tf.reduce_mean(x, 0)))


@pytest.mark.parametrize("num_towers,sizes", [(2, [4, 3]), (3, [3, 2, 2])])
def test_each_tower_applies_its_own_mean_gradient(num_towers, sizes,
                                                  session_config):
  x = np.random.RandomState(0).randn(7, 3).astype(np.float32)
  steps = 3
  values, loss = harness.train(linear_model_fn, x, None, steps,
                               session_config, num_towers=num_towers,
                               synchronization="async")
  bounds = np.cumsum([0] + sizes)
  per_tower = [x[a:b].mean(0) for a, b in zip(bounds[:-1], bounds[1:])]
  # Each step: w -= LR * Σ over towers of the tower's mean of x.
  np.testing.assert_allclose(values["w"], -LR * steps * np.sum(per_tower, 0),
                             rtol=1e-5)
  assert values["global_step"] == steps
  assert loss == pytest.approx(0.0)  # the first step's loss at w = 0.


@pytest.mark.parametrize("num_towers,sizes", [(2, [4, 3]), (3, [3, 2, 2])])
def test_each_tower_steps_on_its_own_shard(num_towers, sizes,
                                           session_config):
  """A tower's step is its own: what couples the batch sees the tower's
  shard (its mean), not the global batch (no op is rewritten)."""
  x = np.random.RandomState(0).randn(7, 3).astype(np.float32)
  values, _ = harness.train(centered_model_fn, x, None, 2, session_config,
                            num_towers=num_towers, synchronization="async")
  bounds = np.cumsum([0] + sizes)
  own = [np.abs(x[a:b] - x[a:b].mean(0)).mean(0)
         for a, b in zip(bounds[:-1], bounds[1:])]
  np.testing.assert_allclose(values["w"], -LR * 2 * np.sum(own, 0),
                             rtol=1e-5)
  with tf.Graph().as_default() as graph:
    tf1.train.get_or_create_global_step()
    fn = emg.multi_gpu(centered_model_fn,
                       devices=harness.cpu_devices(num_towers),
                       synchronization="async")
    harness.call(fn, tf.constant(x), None, tf.estimator.ModeKeys.TRAIN,
                 session_config)
  assert emg.global_batch_ops(graph) == []


def test_one_set_of_slots_with_single_device_names(session_config):
  def model_fn(features, labels, mode):
    pred = tf1.layers.dense(features, 2, name="lin")
    loss = tf1.losses.mean_squared_error(labels, pred)
    opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.1, 0.9))
    return tf.estimator.EstimatorSpec(
        mode, loss=loss,
        train_op=opt.minimize(loss, tf1.train.get_global_step()))

  x, y = harness.linear_data(7)
  one, _ = harness.train(model_fn, x, y, 1, session_config)
  many, _ = harness.train(model_fn, x, y, 2, session_config, num_towers=3,
                          synchronization="async")
  assert sorted(many) == sorted(one)
  assert many["global_step"] == 2


@pytest.mark.parametrize("options,what", [
    ({"variable_update": "replicated"}, "variable_update='replicated'"),
    ({"accumulate_steps": 2}, "accumulate_steps=2"),
    ({"sync_batch_norm": True}, "sync_batch_norm=True"),
    ({"mixed_precision": "float16"}, "mixed_precision='float16'"),
])
def test_combinations_that_make_no_sense_are_errors(options, what):
  with pytest.raises(ValueError, match=f"synchronization='async'.*"
                     f"{what.replace('(', '.').replace(')', '.')}"):
    emg.multi_gpu(linear_model_fn, synchronization="async", **options)


def test_an_unknown_synchronization_is_an_error():
  with pytest.raises(ValueError, match="`synchronization` is 'lazy'"):
    emg.multi_gpu(linear_model_fn, synchronization="lazy")
