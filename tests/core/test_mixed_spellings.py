"""Spellings a second reader of the round's work wrote (issues 39-42).

Each case is one device's, or a WARNING naming what it reads or writes;
expected numbers are numpy's.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
TRAIN = tf.estimator.ModeKeys.TRAIN
RNG = np.random.RandomState(5)
X = RNG.randn(7, 3).astype(np.float32)
Y = RNG.randn(7, 1).astype(np.float32)


def _capture(monkeypatch):
  from estimator_multigpu.graph import warn_once  # pylint: disable=g-import-not-at-top
  said = []
  monkeypatch.setattr(warn_once.logging, "warning",
                      lambda msg, *args: said.append(msg % args))
  return said


def running_stat_model_fn(stat):
  def model_fn(features, labels, mode):
    pred = tf1.layers.dense(features, 1, name="d",
                            kernel_initializer=tf1.ones_initializer())
    err = tf.square(pred - labels)[:, 0]
    loss = tf.reduce_mean(err)
    total = tf1.get_variable("total", initializer=0.0, trainable=False)
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.0))
    train_op = tf.group(opt.minimize(loss, tf1.train.get_global_step()),
                        total.assign_add(stat(err)))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn


@pytest.mark.parametrize("variable_update", ["shared", "replicated"])
def test_an_additive_write_of_a_mean_a_max_or_a_sum_is_exact(
    variable_update, session_config, monkeypatch):
  said = _capture(monkeypatch)
  err = ((X.sum(1, keepdims=True) - Y) ** 2)[:, 0]   # the lr is 0.
  # The global batch's mean, max and sum are written once (global_batch=True,
  # the default): 1 step adds the 7's mean, max, or Σ err; no warning.
  for stat, want in ((tf.reduce_mean, err.mean()), (tf.reduce_max, err.max()),
                     (tf.reduce_sum, err.sum())):
    got, _ = harness.train(running_stat_model_fn(stat), X, Y, 1,
                           session_config, num_towers=3,
                           variable_update=variable_update)
    np.testing.assert_allclose(got["total"], want, rtol=1e-5)
  assert not [s for s in said if "`total`" in s], said


def test_replicated_training_says_nothing_about_initializers(
    session_config, monkeypatch):
  said = _capture(monkeypatch)
  harness.train(running_stat_model_fn(tf.reduce_sum), X, Y, 1,
                session_config, num_towers=2, variable_update="replicated")
  assert not [s for s in said if "updates `d/" in s], said


def _spec_with_hook(mode, loss, hook):
  """A TRAIN spec that leaves the variables as they are, with `hook`."""
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.0))
  return tf.estimator.EstimatorSpec(
      mode, loss=loss, training_hooks=[hook],
      train_op=opt.minimize(loss, tf1.train.get_global_step()))


def _three_towers(model_fn, session_config):
  """The TRAIN spec of `model_fn` on 3 towers, in the default graph."""
  tf1.train.get_or_create_global_step()
  return harness.call(emg.multi_gpu(model_fn, devices=harness.cpu_devices(3)),
                      tf.constant(X), tf.constant(Y), TRAIN, session_config)


def test_summary_saver_hook_of_merge_all_in_every_tower(session_config):
  def model_fn(features, labels, mode):
    pred = tf1.layers.dense(features, 1, name="d")
    loss = tf1.losses.mean_squared_error(labels, pred)
    tf1.summary.scalar("loss", loss)
    hook = tf1.train.SummarySaverHook(save_steps=1, output_dir="/tmp",
                                      summary_op=tf1.summary.merge_all())
    return _spec_with_hook(mode, loss, hook)
  with tf.Graph().as_default():
    spec = _three_towers(model_fn, session_config)
  assert len(spec.training_hooks) >= 1


def _predict_ids(width, session_config, num_towers=2):
  """The "ids" prediction, zeros [examples, width(features)] int32, of the
  first 5 examples; unwrapped with `num_towers` None."""
  def model_fn(features, labels, mode):
    del labels
    shape = [tf.shape(features)[0], width(features)]
    return tf.estimator.EstimatorSpec(
        mode, predictions={"ids": tf.zeros(shape, tf.int32)})
  with tf.Graph().as_default():
    x = tf1.data.make_one_shot_iterator(
        tf.data.Dataset.from_tensors(X[:5]).repeat()).get_next()
    fn = model_fn if num_towers is None else emg.multi_gpu(
        model_fn, devices=harness.cpu_devices(num_towers),
        prediction_pad_value=-1.0)
    spec = harness.call(fn, x, None, tf.estimator.ModeKeys.PREDICT,
                        session_config)
    with tf1.Session(config=session_config) as session:
      return session.run(spec.predictions["ids"])


def test_one_numeric_pad_value_pads_integer_predictions(session_config):
  # A width the shard's rows count in a loop: loops are not rewritten, so
  # the width stays the shard's (3 and 2) and the towers' ids are padded.
  def loop_count(features):
    return tf1.while_loop(lambda i: i < tf.shape(features)[0],
                          lambda i: i + 1, [0])
  ids = _predict_ids(loop_count, session_config)
  # shards of 3 and 2: rows 3-4 are [0, 0, -1] (width 2 padded to 3).
  np.testing.assert_array_equal(ids[:3], np.zeros([3, 3]))
  np.testing.assert_array_equal(ids[3:], [[0, 0, -1], [0, 0, -1]])


def test_a_width_of_the_shard_size_is_the_global_batch_size(session_config):
  """`tf.shape(x)[0]` in a width is the global batch's (global_batch=True):
  one device's [5, 5] zeros, nothing padded."""
  width = lambda features: tf.shape(features)[0]  # noqa: E731
  ids = _predict_ids(width, session_config)
  np.testing.assert_array_equal(ids, np.zeros([5, 5]))
  np.testing.assert_array_equal(ids, _predict_ids(width, session_config,
                                                  num_towers=None))


class _Keep(tf1.train.SessionRunHook):
  """Keeps what it fetches each step."""

  def __init__(self, fetches):
    self.fetches, self.values = fetches, []

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs(self.fetches)

  def after_run(self, run_context, run_values):
    self.values.append(run_values.results)


def test_a_hook_fetching_the_labels_or_a_count_of_the_shard(
    session_config, monkeypatch):
  said = _capture(monkeypatch)

  def model_fn(features, labels, mode):
    pred = tf1.layers.dense(features, 1, name="d")
    loss = tf1.losses.mean_squared_error(labels, pred)
    hits = tf.reduce_sum(tf.cast(pred > labels, tf.int32))
    return _spec_with_hook(mode, loss, _Keep({"labels": labels,
                                              "hits": hits}))
  with tf.Graph().as_default():
    spec = _three_towers(model_fn, session_config)
    with tf1.train.MonitoredSession(
        tf1.train.ChiefSessionCreator(config=session_config),
        hooks=spec.training_hooks) as session:
      session.run(spec.train_op)
  hook = [h for h in spec.training_hooks if isinstance(h, _Keep)][0]
  np.testing.assert_allclose(hook.values[0]["labels"], Y)   # all 7 rows.
  assert any("fetches" in s and "Sum" in s for s in said), said


@pytest.mark.parametrize("divide", [
    lambda total, b: total / b, lambda total, b: total * (1.0 / b),
    lambda total, b: tf.math.divide(total, tf.cast(b, tf.float32))])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_a_sum_divided_by_params_batch_size_is_one_devices(
    divide, reduction, session_config, monkeypatch):
  # Σ/B over the shard: a sum, which the towers' combination counts once
  # under either reduction (under "mean" it is made global).
  def model_fn(features, labels, mode, params):
    pred = tf1.layers.dense(features, 1, name="d",
                           kernel_initializer=tf1.ones_initializer())
    loss = divide(tf.reduce_sum(tf.square(pred - labels)),
                  params["batch_size"])
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
    return tf.estimator.EstimatorSpec(
        mode, loss=loss,
        train_op=opt.minimize(loss, tf1.train.get_global_step()))

  def with_params(features, labels, mode):
    return model_fn(features, labels, mode, {"batch_size": 7})
  said = _capture(monkeypatch)
  got, got_loss = harness.train(with_params, X, Y, 1, session_config,
                                num_towers=2, loss_reduction=reduction)
  want, want_loss = harness.train(with_params, X, Y, 1, session_config)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
  harness.assert_same_variables(got, want)
  assert not any("loss_reduction='sum'" in s for s in said), said
