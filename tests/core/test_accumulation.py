"""`accumulate_steps=k`: k micro-batches, one update equal to the big batch's.

The model is linear regression, pred = x @ W + b, loss = mean((pred - y)²)
over the batch and the 2 outputs; its gradient is dW = 2/(n·2) · xᵀ(pred - y),
db = 2/(n·2) · Σ(pred - y). numpy applies TF1's Momentum and Adam rules to
the whole 10-example batch; the wrapped model_fn reads it as k micro-batches
(10 = 5+5, 4+4+2, 3+3+3+1: uneven ones included) from a tf.data iterator,
as Estimator's input_fn would.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
TRAIN = tf.estimator.ModeKeys.TRAIN
W0 = np.array([[0.1, -0.2], [0.3, 0.05], [-0.4, 0.2]], np.float32)
B0 = np.array([0.01, -0.02], np.float32)
LR = 0.05
EXAMPLES = 10
MICRO_BATCH = {1: 10, 2: 5, 3: 4, 4: 3}  # k -> size giving k batches of 10.


def optimizer(name):
  return {"momentum": lambda: tf1.train.MomentumOptimizer(LR, 0.9),
          "adam": lambda: tf1.train.AdamOptimizer(LR)}[name]()


def linear_model_fn(optimizer_name, reduction="mean"):
  def model_fn(features, labels, mode):
    w = tf1.get_variable("w", initializer=W0)
    b = tf1.get_variable("b", initializer=B0)
    per_example = tf.reduce_mean(
        tf.square(tf.matmul(features, w) + b - labels), axis=1)
    loss = (tf.reduce_mean(per_example) if reduction == "mean" else
            tf.reduce_sum(per_example))
    opt = emg.TowerOptimizer(optimizer(optimizer_name))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
        loss, tf1.train.get_global_step()))
  return model_fn


def numpy_train(optimizer_name, x, y, steps, lr=LR):
  """TF1's update rules on the whole batch; returns params and losses."""
  params = [W0.astype(np.float64), B0.astype(np.float64)]
  slots = [[np.zeros_like(p), np.zeros_like(p)] for p in params]
  losses = []
  for t in range(1, steps + 1):
    residual = x @ params[0] + params[1] - y
    losses.append(np.mean(residual ** 2))
    scale = 2.0 / residual.size
    grads = [scale * x.T @ residual, scale * residual.sum(axis=0)]
    for p, g, (m, v) in zip(params, grads, slots):
      if optimizer_name == "momentum":
        m[:] = 0.9 * m + g
        p -= lr * m
      else:  # adam, TF1's bias correction folded into the rate.
        m[:] = 0.9 * m + 0.1 * g
        v[:] = 0.999 * v + 0.001 * g * g
        p -= lr * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m / (
            np.sqrt(v) + 1e-8)
  return params, losses


def train_accumulated(model_fn, x, y, micro_batch, updates, session_config,
                      num_towers, **options):
  """Runs `updates` training steps the way Estimator does (with its hooks).

  Returns:
    {variable: value} afterwards, the spec's loss at each step, and the
    number of examples the input pipeline delivered.
  """
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(micro_batch)
    features, labels = tf1.data.make_one_shot_iterator(
        dataset.repeat()).get_next()
    seen = tf1.Variable(0, trainable=False, name="seen",
                        collections=[tf1.GraphKeys.LOCAL_VARIABLES])
    with tf.control_dependencies([seen.assign_add(tf.shape(features)[0])]):
      features = tf.identity(features)
    fn = emg.multi_gpu(model_fn, devices=harness.cpu_devices(num_towers),
                       **options)
    spec = harness.call(fn, features, labels, TRAIN, session_config)
    with tf1.train.SingularMonitoredSession(
        hooks=spec.training_hooks, config=session_config) as session:
      losses = [session.run([spec.loss, spec.train_op])[0]
                for _ in range(updates)]
      raw = session.raw_session()
      values = {v.op.name: raw.run(v) for v in tf1.global_variables()}
      return values, losses, raw.run(seen)


@pytest.mark.parametrize("num_towers", [1, 2, 3, 4])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("optimizer_name", ["momentum", "adam"])
def test_accumulation_equals_one_big_batch(num_towers, k, optimizer_name,
                                           session_config):
  x, y = harness.linear_data(EXAMPLES)
  updates = 3
  values, losses, seen = train_accumulated(
      linear_model_fn(optimizer_name), x, y, MICRO_BATCH[k], updates,
      session_config, num_towers, accumulate_steps=k)
  (want_w, want_b), want_losses = numpy_train(optimizer_name, x, y, updates)
  np.testing.assert_allclose(values["w"], want_w, atol=1e-5)
  np.testing.assert_allclose(values["b"], want_b, atol=1e-5)
  np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
  assert values["global_step"] == updates  # counts updates, not batches.
  assert seen == updates * EXAMPLES  # every step read all k micro-batches.


def test_sum_reduction_and_clipping(session_config):
  # "sum": the big batch's gradient is Σ of the micro-batches' (no division),
  # 10 times the "mean" gradient, so Momentum's first step (m = g) equals
  # numpy's "mean" step at 10·LR. Clipping to a huge norm changes nothing but
  # takes the rule's own clipping path.
  x, y = harness.linear_data(EXAMPLES)

  values, losses, _ = train_accumulated(
      linear_model_fn("momentum", "sum"), x, y, 3, 1, session_config, 2,
      accumulate_steps=4, loss_reduction="sum", clip_gradients_by_norm=1e6)
  (want_w, want_b), want_losses = numpy_train("momentum", x, y, 1,
                                              lr=LR * EXAMPLES)
  np.testing.assert_allclose(values["w"], want_w, atol=1e-5)
  np.testing.assert_allclose(values["b"], want_b, atol=1e-5)
  # The "sum" loss is Σ over examples of the mean over outputs: 10 x mean.
  np.testing.assert_allclose(losses[0], EXAMPLES * want_losses[0], rtol=1e-5)


def test_clipping_acts_on_the_accumulated_gradient(session_config):
  # Clipping to norm c scales the whole update's gradient g to c·g/|g|; with
  # SGD the step is LR·c·g/|g|, computed here from numpy's g.
  x, y = harness.linear_data(EXAMPLES)

  def model_fn(features, labels, mode):
    w = tf1.get_variable("w", initializer=W0)
    b = tf1.get_variable("b", initializer=B0)
    loss = tf.reduce_mean(tf.square(tf.matmul(features, w) + b - labels))
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(LR))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
        loss, tf1.train.get_global_step()))

  values, _, _ = train_accumulated(model_fn, x, y, 3, 1, session_config, 2,
                                   accumulate_steps=4,
                                   clip_gradients_by_norm=0.1)
  residual = x @ W0 + B0 - y
  g_w, g_b = x.T @ residual / 10, residual.sum(axis=0) / 10  # 2/(10·2).
  norm = np.sqrt(np.sum(g_w ** 2) + np.sum(g_b ** 2))
  assert norm > 0.1  # so the clip acts.
  np.testing.assert_allclose(values["w"], W0 - LR * 0.1 * g_w / norm,
                             atol=1e-6)
  np.testing.assert_allclose(values["b"], B0 - LR * 0.1 * g_b / norm,
                             atol=1e-6)


def embedding_model_fn(features, labels, mode):
  """A sparse gradient: rows of an embedding table, Momentum (sparse apply
  touches only the rows present in the gradient)."""
  table = tf1.get_variable(
      "table", initializer=np.arange(24, dtype=np.float32).reshape(8, 3) / 10)
  rows = tf.nn.embedding_lookup(table, features)
  loss = tf.reduce_mean(tf.square(tf.reduce_sum(rows, axis=1) - labels))
  opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(LR, 0.9))
  grads_and_vars = opt.compute_gradients(loss)
  assert isinstance(grads_and_vars[0][0], tf.IndexedSlices)
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=(
      opt.apply_gradients(grads_and_vars, tf1.train.get_global_step())))


def test_sparse_gradients_accumulate_exactly(session_config):
  # Rows 6 and 7 are never looked up: with sparse Momentum they must keep
  # their initial values exactly; the others must match the unwrapped
  # model_fn trained on the 10-example batch (the single-device reference).
  ids = np.array([0, 1, 2, 3, 0, 5, 1, 1, 4, 2], np.int32)
  targets = np.linspace(-1, 1, 10).astype(np.float32)
  reference, _ = harness.train(embedding_model_fn, ids, targets, 3,
                               session_config)
  values, _, _ = train_accumulated(embedding_model_fn, ids, targets, 3, 3,
                                   session_config, 2, accumulate_steps=4)
  np.testing.assert_allclose(values["table"], reference["table"], atol=1e-5)
  initial = np.arange(24, dtype=np.float32).reshape(8, 3) / 10
  np.testing.assert_array_equal(values["table"][6:], initial[6:])
  assert not np.allclose(values["table"][:6], initial[:6])


def test_ema_updates_once_per_update(session_config):
  # The shadow follows ema.py's formula once per update, with t the global
  # step after the update: decay_t = min(0.9, (1 + t) / (10 + t)).
  x, y = harness.linear_data(EXAMPLES)
  values, _, _ = train_accumulated(
      linear_model_fn("momentum"), x, y, 4, 2, session_config, 2,
      accumulate_steps=3, ema_decay=0.9)
  shadow = W0.astype(np.float64)
  for t in (1, 2):
    (w_t, _), _ = numpy_train("momentum", x, y, t)
    decay = min(0.9, (1 + t) / (10 + t))
    shadow = decay * shadow + (1 - decay) * w_t
  np.testing.assert_allclose(values["w/ExponentialMovingAverage"], shadow,
                             atol=1e-5)


def bn_model_fn(features, labels, mode):
  net = tf1.layers.batch_normalization(features, momentum=0.5, training=True)
  w = tf1.get_variable("w", initializer=W0)
  loss = tf.reduce_mean(tf.square(tf.matmul(net, w) - labels))
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(LR))
  with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
    train_op = opt.minimize(loss, tf1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_batch_norm_statistics_update_every_micro_batch(session_config):
  # Documented rule: tower 0's UPDATE_OPS run with every micro-batch. With
  # micro-batches of 4, 4, 2 on 2 towers, tower 0's shards are rows 0-1,
  # 4-5 and 8; momentum 0.5: mean ← 0.5·mean + 0.5·shard mean, from 0.
  x, y = harness.linear_data(EXAMPLES)
  values, _, _ = train_accumulated(bn_model_fn, x, y, 4, 1, session_config,
                                   2, accumulate_steps=3)
  mean = np.zeros(3)
  for rows in (x[0:2], x[4:6], x[8:9]):
    mean = 0.5 * mean + 0.5 * rows.mean(axis=0)
  np.testing.assert_allclose(values["batch_normalization/moving_mean"], mean,
                             atol=1e-6)
  assert values["global_step"] == 1


def test_estimator_train_steps_1_consumes_k_batches(run_config):
  # An input of exactly k=3 micro-batches: train(steps=2) stops at the end of
  # the input after ONE update (global_step 1) equal to the big-batch step.
  x, y = harness.linear_data(EXAMPLES)

  def input_fn():
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(4)

  estimator = tf.estimator.Estimator(
      emg.multi_gpu(linear_model_fn("momentum"), devices=["/cpu:0", "/cpu:1"],
                    accumulate_steps=3), config=run_config)
  estimator.train(input_fn, steps=2)
  assert estimator.get_variable_value("global_step") == 1
  (want_w, _), _ = numpy_train("momentum", x, y, 1)
  np.testing.assert_allclose(estimator.get_variable_value("w"), want_w,
                             atol=1e-5)
  # Checkpoints hold no accumulators: the unwrapped model_fn reads them.
  names = [name for name, _ in tf.train.list_variables(estimator.model_dir)]
  assert not [n for n in names if "accumulation" in n], names


@pytest.mark.parametrize("value,error", [
    (0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError)])
def test_bad_accumulate_steps_is_a_clear_error(value, error):
  with pytest.raises(error, match="accumulate_steps"):
    emg.multi_gpu(linear_model_fn("momentum"), accumulate_steps=value)
