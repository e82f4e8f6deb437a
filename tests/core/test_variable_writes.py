"""Variables the model_fn writes itself, found by what the ops do (#41).

Whatever the op (`assign*`, `scatter_*`, `resource_scatter_*`, a Keras
layer's `add_update`) and however it runs with the step (grouped into the
train_op, a control dependency of `minimize`, inside a `tf.cond`, in a
hook's op): an additive write of a sum over the tower's examples is made
one device's (every tower's write runs), a write of the batch's max is
(computed on the global batch, outside a `tf.cond`), anything else that
depends on the shard is a WARNING naming the variable, the op and the
cross-tower tool.

Model: pred = x @ w, loss = mean((pred - y)²) with SGD; the writes keep a
class histogram (`hist[c]` += examples of class c) or an example count,
numpy references by hand: after 3 steps of the batch of 7, hist =
3·bincount(classes) and count = 21.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
BATCH, STEPS = 7, 3
X, Y = harness.linear_data(BATCH)
CLASSES = np.argmax(X, axis=1)  # each example's class: its largest input.
W0 = np.array([[0.1, -0.2], [0.3, 0.05], [-0.4, 0.2]], np.float32)
STRATEGIES = {"shared": {}, "replicated": {"variable_update": "replicated"},
              "async": {"synchronization": "async"}}


class OpHook(tf1.train.SessionRunHook):
  """Runs `op` with every step (a hook's own train op)."""

  def __init__(self, op):
    self.op = op

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs(self.op)


class Counting(tf.keras.layers.Layer):
  """A Keras layer counting its examples with `add_update`."""

  def build(self, input_shape):
    self.seen = self.add_weight("seen", [], trainable=False,
                                initializer="zeros")

  def call(self, x):
    self.add_update(self.seen.assign_add(tf.cast(tf.shape(x)[0],
                                                 tf.float32)))
    return x


def _classes(features):
  return tf.argmax(features, axis=1, output_type=tf.int32)


def histogram(how, write):
  """A model_fn whose step also adds each example's class into `hist`."""
  def model_fn(features, labels, mode):
    w = tf1.get_variable("w", initializer=W0)
    hist = tf1.get_variable("hist", initializer=tf.zeros([3]),
                            trainable=False)
    loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
    return _spec(mode, loss, lambda: write(hist, _classes(features),
                                           features), how)
  return model_fn


def _spec(mode, loss, make_update, how):
  """The spec whose step runs `make_update()`'s write `how`."""
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
  step = tf1.train.get_global_step()
  hooks = []
  if how == "cond":  # the write is built inside the branch.
    update = tf.cond(tf.reduce_sum(loss) > -1.0,
                     lambda: tf.group(make_update()), tf.no_op)
    how = "control_dependency"
  else:
    update = make_update()
  if how == "grouped":
    train_op = tf.group(opt.minimize(loss, step), update)
  elif how == "control_dependency":
    with tf.control_dependencies([update]):
      train_op = opt.minimize(loss, step)
  else:  # "hook"
    train_op, hooks = opt.minimize(loss, step), [OpHook(update)]
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                    training_hooks=hooks)


def scatter_add(hist, classes, features):
  del features
  return tf1.scatter_add(hist, classes, tf.ones_like(classes, tf.float32))


def resource_scatter_add(hist, classes, features):
  del features
  return hist.scatter_add(tf.IndexedSlices(
      tf.ones_like(classes, tf.float32), classes))


def scatter_nd_add(hist, classes, features):
  del features
  return tf1.scatter_nd_add(hist, classes[:, None],
                            tf.ones_like(classes, tf.float32))


def bincount_assign_add(hist, classes, features):
  del features
  return hist.assign_add(tf.math.bincount(classes, minlength=3,
                                          dtype=tf.float32))


def centers_moved(hist, classes, features):
  """Center loss's update: reads the variable (not additive)."""
  diff = tf.gather(hist, classes) - features[:, 0]
  return tf1.scatter_sub(hist, classes, 0.5 * diff)


def moving_max(hist, classes, features):
  """The largest |x| seen (the batch's is in its last example, row 6)."""
  del classes
  return hist.assign(tf.maximum(hist, tf.reduce_max(tf.abs(features))))


def scatter_update(hist, classes, features):
  return tf1.scatter_update(hist, classes, features[:, 0])


def run(model_fn, session_config, num_towers=None, **options):
  """The variables after STEPS steps of the train_op and its hooks' ops."""
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    fn = model_fn if num_towers is None else emg.multi_gpu(
        model_fn, devices=harness.cpu_devices(num_towers), **options)
    spec = harness.call(fn, tf.constant(X), tf.constant(Y), "train",
                        session_config)
    fetches = [spec.train_op] + [h.op for h in spec.training_hooks
                                 if isinstance(h, OpHook)]
    with tf1.Session(config=session_config) as session:
      session.run(tf1.global_variables_initializer())
      session.run(tf1.local_variables_initializer())  # copies: after.
      for _ in range(STEPS):
        session.run(fetches)
      variables = tf1.global_variables()
      return dict(zip([v.op.name for v in variables],
                      session.run(variables)))


ADDITIVE = {"scatter_add": scatter_add,
            "resource_scatter_add": resource_scatter_add,
            "scatter_nd_add": scatter_nd_add,
            "bincount_assign_add": bincount_assign_add}
HOW = ["grouped", "control_dependency", "hook"]


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("write", sorted(ADDITIVE))
@pytest.mark.parametrize("num_towers", [2, 3])
def test_additive_writes_count_the_global_batch(num_towers, write, how,
                                                session_config):
  got = run(histogram(how, ADDITIVE[write]), session_config, num_towers)
  np.testing.assert_allclose(got["hist"], STEPS * np.bincount(CLASSES),
                             atol=1e-6)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("num_towers", [2, 3])
def test_additive_writes_in_every_strategy(num_towers, strategy,
                                           session_config):
  model_fn = histogram("control_dependency", scatter_add)
  want = run(model_fn, session_config)
  got = run(model_fn, session_config, num_towers, **STRATEGIES[strategy])
  np.testing.assert_allclose(got["hist"], want["hist"], atol=1e-6)
  if strategy != "async":
    harness.assert_same_variables(got, want)


def keras_counter(how):
  def model_fn(features, labels, mode):
    layer = Counting()
    x = layer(features)
    w = tf1.get_variable("w", initializer=W0)
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - labels))
    return _spec(mode, loss, lambda: tf.group(layer.updates), how)
  return model_fn


@pytest.mark.parametrize("how", ["grouped", "control_dependency"])
@pytest.mark.parametrize("num_towers", [2, 3])
def test_keras_add_update_counts_the_global_batch(num_towers, how,
                                                  session_config):
  got = run(keras_counter(how), session_config, num_towers)
  assert got["counting/seen"] == STEPS * BATCH


INEXACT = {"centers_moved": (centers_moved, "ScatterSub"),
           "moving_max": (moving_max, "AssignVariableOp"),
           "scatter_update": (scatter_update, "ScatterUpdate")}
# A max over the batch is combined over the towers (global_batch=True, the
# default) where the model_fn builds it, not inside a tf.cond's branch.
# Outside a tf.cond, a write of the shard's rows is gathered and written
# once, in tower 0 (global_batch=True): one device's.
INEXACT_CASES = [(write, "cond") for write in sorted(INEXACT)]


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("write", ["centers_moved", "scatter_update"])
@pytest.mark.parametrize("num_towers", [2, 3])
def test_writes_of_the_shards_rows_are_one_devices(num_towers, write, how,
                                                   caplog, session_config):
  with caplog.at_level(logging.WARNING, logger="absl"):
    got = run(histogram(how, INEXACT[write][0]), session_config, num_towers)
  harness.assert_same_variables(
      got, run(histogram(how, INEXACT[write][0]), session_config))
  assert "`hist`" not in caplog.text


@pytest.mark.parametrize("write,how", INEXACT_CASES)
def test_other_writes_warn_naming_variable_op_and_tool(write, how, caplog,
                                                       session_config):
  model_fn = histogram(how, INEXACT[write][0])
  with caplog.at_level(logging.WARNING, logger="absl"):
    run(model_fn, session_config, 2)
  said = [r.getMessage() for r in caplog.records if "`hist`" in
          r.getMessage()]
  assert len(said) == 1, caplog.text
  assert INEXACT[write][1] in said[0] and "cross_tower_sum" in said[0]
  assert {"grouped": "grouped into the train_op",
          "control_dependency": "control dependency",
          "cond": "tf.cond", "hook": "outside the train_op"}[how] in said[0]


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("num_towers", [2, 3])
def test_a_moving_max_of_the_batch_is_one_devices(num_towers, how, caplog,
                                                  session_config):
  with caplog.at_level(logging.WARNING, logger="absl"):
    got = run(histogram(how, moving_max), session_config, num_towers)
  np.testing.assert_allclose(got["hist"], np.abs(X).max(), rtol=1e-6)
  harness.assert_same_variables(
      got, run(histogram(how, moving_max), session_config))
  assert "`hist`" not in caplog.text


def test_additive_write_in_a_cond_warns(caplog, session_config):
  with caplog.at_level(logging.WARNING, logger="absl"):
    run(histogram("cond", scatter_add), session_config, 3)
  said = [r.getMessage() for r in caplog.records if "`hist`" in
          r.getMessage()]
  assert len(said) == 1 and "tf.cond" in said[0], caplog.text


def max_norm(grouped):
  """A max-norm constraint written after the update: w ← clip_by_norm(w)."""
  def model_fn(features, labels, mode):
    w = tf1.get_variable("w", initializer=W0 * 4.0)
    loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
    opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.1, 0.9))
    minimize = opt.minimize(loss, tf1.train.get_global_step())
    with tf.control_dependencies([minimize]):
      clip = tf1.assign(w, tf.clip_by_norm(w, 1.0))
    train_op = tf.group(minimize, clip) if grouped else clip.op
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn


@pytest.mark.parametrize("strategy", ["shared", "replicated"])
@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("num_towers", [2, 3])
def test_a_constraint_after_the_update_is_one_devices(num_towers, grouped,
                                                      strategy,
                                                      session_config):
  want = run(max_norm(grouped), session_config)
  got = run(max_norm(grouped), session_config, num_towers,
            **STRATEGIES[strategy])
  assert np.linalg.norm(want["w"]) <= 1.0 + 1e-5  # it was 2.4 at first.
  harness.assert_same_variables(got, want)
