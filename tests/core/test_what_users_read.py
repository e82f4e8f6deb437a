"""What the user reads over 2 and 3 towers equals one device's (issue 31).

Eval metrics fed batch-level values, metrics whose update reads their own
state, metric names of any characters, the user's scalar summaries and the
tensors hooks fetch, in TRAIN and EVAL. Each graph is built and run in a
plain session (no checkpoints), on 11 examples in uneven batches of 5, 4 and
2 (3 towers cut the last one 1/1/0: an empty shard). Expected numbers are
numpy on the same data.
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_slim

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
EVAL, TRAIN = tf.estimator.ModeKeys.EVAL, tf.estimator.ModeKeys.TRAIN
RNG = np.random.RandomState(3)
X = RNG.randn(11, 2).astype(np.float32)
Y = RNG.randn(11).astype(np.float32)
WT = RNG.rand(11).astype(np.float32)
W0 = np.array([0.5, -1.0], np.float32)
BATCHES = [slice(0, 5), slice(5, 9), slice(9, 11)]
PRED = X @ W0
ERR = (PRED - Y) ** 2


def regression_model_fn(features, labels, mode):
  w = tf1.get_variable("w", initializer=W0)
  pred = tf.reduce_sum(features["x"] * w, 1)
  err = tf.square(pred - labels)
  loss = tf.reduce_mean(err)
  keras_mean = tf.keras.metrics.Mean()
  keras_mean.update_state(loss)
  metrics = {
      "loss/mean": tf1.metrics.mean(loss),
      "metric/ndcg@3": tf1.metrics.mean(tf.reduce_mean(err), weights=2.0),
      "mean tensor:x": tf1.metrics.mean_tensor(
          tf.reduce_mean(tf.stack([err, 2 * err], 1), 0)),
      "keras_mean": keras_mean,
      "per_example": tf1.metrics.mean(err, weights=features["wt"]),
      "pearson": tf_slim.metrics.streaming_pearson_correlation(pred, labels),
      "covariance_weighted": tf_slim.metrics.streaming_covariance(
          pred, labels, weights=features["wt"]),
  }
  return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)


def evaluate(model_fn, num_towers, session_config, batches=BATCHES):
  """{metric: value} after every batch's update, unwrapped or on towers."""
  with tf.Graph().as_default():
    x = tf1.placeholder(tf.float32, [None, 2])
    y = tf1.placeholder(tf.float32, [None])
    wt = tf1.placeholder(tf.float32, [None])
    fn = model_fn if num_towers is None else emg.multi_gpu(
        model_fn, devices=harness.cpu_devices(num_towers))
    spec = harness.call(fn, {"x": x, "wt": wt}, y, EVAL, session_config)
    with tf1.Session(config=session_config) as session:
      session.run([tf1.global_variables_initializer(),
                   tf1.local_variables_initializer()])
      for batch in batches:
        session.run([u for _, u in spec.eval_metric_ops.values()],
                    {x: X[batch], y: Y[batch], wt: WT[batch]})
      return {k: session.run(v) for k, (v, _) in
              spec.eval_metric_ops.items()}


def numpy_metrics():
  batch_means = np.array([ERR[b].mean() for b in BATCHES])
  p, l, w = PRED.astype(np.float64), Y.astype(np.float64), WT
  pm, lm = np.average(p, weights=w), np.average(l, weights=w)
  return {
      "loss/mean": batch_means.mean(),         # one value per batch.
      "metric/ndcg@3": batch_means.mean(),     # equal weights 2.0 cancel.
      "mean tensor:x": [batch_means.mean(), 2 * batch_means.mean()],
      "keras_mean": batch_means.mean(),
      "per_example": np.average(ERR, weights=WT),
      "pearson": np.corrcoef(p, l)[0, 1],
      # tf-slim: Σ w (p - p̄)(l - l̄) / (Σ w - 1).
      "covariance_weighted": np.sum(w * (p - pm) * (l - lm)) / (w.sum() - 1),
  }


@pytest.fixture(scope="module")
def one_device():
  return evaluate(regression_model_fn, None,
                  emg.make_session_config(num_cpus=4))


def test_one_device_matches_numpy(one_device):
  for name, expected in numpy_metrics().items():
    np.testing.assert_allclose(one_device[name], expected, rtol=1e-5,
                               err_msg=name)


@pytest.mark.parametrize("num_towers", [2, 3])
def test_metrics_over_towers_equal_one_device(num_towers, one_device,
                                              session_config):
  towers = evaluate(regression_model_fn, num_towers, session_config)
  for name, expected in one_device.items():
    np.testing.assert_allclose(towers[name], expected, rtol=1e-5, atol=1e-6,
                               err_msg=name)


class FetchHook(tf1.train.SessionRunHook):
  """A custom hook that keeps the tensor it fetches."""

  def __init__(self, tensor):
    self.tensor = tensor


def readout_model_fn(features, labels, mode):
  w = tf1.get_variable("w", initializer=W0)
  err = tf.square(tf.reduce_sum(features["x"] * w, 1) - labels)
  loss = tf.reduce_mean(err)
  err_mean = tf.reduce_mean(err, name="mean_err")
  tf1.summary.scalar("loss", loss)
  tf1.summary.scalar("err_mean", err_mean)
  tf1.summary.scalar("err_sum", tf.reduce_sum(err))
  tf1.summary.scalar("err_max", tf.reduce_max(err))
  hooks = [tf1.train.LoggingTensorHook({"loss": loss, "err": "mean_err"},
                                       every_n_iter=1),
           FetchHook(loss)]
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.0))
  return tf.estimator.EstimatorSpec(
      mode, loss=loss, train_op=opt.minimize(loss, tf1.train.get_global_step()),
      training_hooks=hooks if mode == TRAIN else None,
      evaluation_hooks=hooks if mode == EVAL else None,
      eval_metric_ops={"err": tf1.metrics.mean(err)} if mode == EVAL else None)


def readouts(mode, num_towers, session_config, **options):
  """The summaries' values and the hooks' tensors on the first batch."""
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    x = tf1.placeholder(tf.float32, [None, 2])
    y = tf1.placeholder(tf.float32, [None])
    fn = emg.multi_gpu(readout_model_fn,
                       devices=harness.cpu_devices(num_towers), **options)
    spec = harness.call(fn, {"x": x}, y, mode, session_config)
    hooks = spec.training_hooks if mode == TRAIN else spec.evaluation_hooks
    logging_hook, fetch_hook = [h for h in hooks if not type(h).__module__
                                .startswith("estimator_multigpu")]
    with tf1.Session(config=session_config) as session:
      session.run([tf1.global_variables_initializer(),
                   tf1.local_variables_initializer()])
      feed = {x: X[BATCHES[0]], y: Y[BATCHES[0]]}
      summary = tf1.Summary.FromString(session.run(tf1.summary.merge_all(),
                                                   feed))
      read = {v.tag: v.simple_value for v in summary.value}
      read["hook/fetch"] = session.run(fetch_hook.tensor, feed)
      for tag, tensor in logging_hook._tensors.items():  # pylint: disable=protected-access
        read[f"hook/{tag}"] = session.run(tensor, feed)
  return read


@pytest.mark.parametrize("mode,num_towers,options", [
    (TRAIN, 2, {}), (TRAIN, 3, {}), (TRAIN, 3, {"accumulate_steps": 2}),
    (EVAL, 2, {}), (EVAL, 3, {})])
def test_summaries_and_hooks_read_the_global_batch(mode, num_towers, options,
                                                   session_config):
  err = ERR[BATCHES[0]]   # the first batch: 5 examples.
  read = readouts(mode, num_towers, session_config, **options)
  for tag in ("loss", "err_mean", "hook/loss", "hook/err", "hook/fetch"):
    np.testing.assert_allclose(read[tag], err.mean(), rtol=1e-5, err_msg=tag)
  np.testing.assert_allclose(read["err_sum"], err.sum(), rtol=1e-5)
  # A max is the global batch's max (issue 39; round 4 left tower 0's).
  np.testing.assert_allclose(read["err_max"], err.max(), rtol=1e-5)


def listwise_model_fn(features, labels, mode, params):
  """A softmax over the batch's examples (a listwise score), written naively
  or with the cross-tower tools."""
  del labels
  w = tf1.get_variable("w", initializer=W0)
  scores = tf.reduce_sum(features["x"] * w, 1)
  if params["cross_tower"]:
    top = tf.reduce_max(emg.cross_tower_concat(scores))
    z = tf.exp(scores - top)
    probabilities = z / emg.cross_tower_sum(tf.reduce_sum(z))
    centered = scores - emg.cross_tower_sum(tf.reduce_sum(
        scores)) / emg.cross_tower_sum(tf.cast(tf.size(scores), tf.float32))
  else:
    probabilities = tf.nn.softmax(scores, axis=0)
    centered = scores - tf.reduce_mean(scores)
  return tf.estimator.EstimatorSpec(mode, predictions={
      "p": probabilities, "centered": centered, "scores": scores})


def predict(num_towers, cross_tower, session_config, rows=slice(0, 5)):
  with tf.Graph().as_default():   # a placeholder input would be export.
    x = tf1.data.make_one_shot_iterator(tf.data.Dataset.from_tensors(
        X[rows]).repeat()).get_next()
    fn = emg.multi_gpu(listwise_model_fn,
                       devices=harness.cpu_devices(num_towers))
    spec = fn({"x": x}, None, tf.estimator.ModeKeys.PREDICT,
              {"cross_tower": cross_tower}, harness.config_for(session_config))
    with tf1.Session(config=session_config) as session:
      session.run(tf1.global_variables_initializer())
      return session.run(spec.predictions)


@pytest.mark.parametrize("cross_tower", [True, False])
def test_batch_predictions_are_exact_with_or_without_the_tools(
    cross_tower, session_config, caplog):
  """The naive softmax over the batch and `x - mean(x)` are computed on the
  global batch (`global_batch=True`, the default): no warning either."""
  scores = PRED[:5]
  expected = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
  for num_towers in (2, 3):
    got = predict(num_towers, cross_tower, session_config)
    np.testing.assert_allclose(got["p"], expected, rtol=1e-5)
    np.testing.assert_allclose(got["centered"], scores - scores.mean(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["scores"], scores, rtol=1e-5)
  assert "couples the examples" not in caplog.text


def test_a_prediction_key_missing_from_a_tower_names_key_and_tower(
    session_config):
  def model_fn(features, labels, mode):
    del labels
    x = features["x"]
    predictions = {"scores": x[:, 0]}
    if "tower_1" not in tf1.get_default_graph().get_name_scope():
      predictions["classes"] = x[:, 1]
    return tf.estimator.EstimatorSpec(mode, predictions=predictions)
  with tf.Graph().as_default(), pytest.raises(
      ValueError, match=r"key 'classes'.*tower 1 lacks it"):
    emg.multi_gpu(model_fn, devices=harness.cpu_devices(2))(
        {"x": tf.constant(X)}, None, tf.estimator.ModeKeys.PREDICT, {},
        harness.config_for(session_config))


LISTS = RNG.randn(7, 4).astype(np.float32)            # 7 lists of 4 items.
RELEVANCE = np.array([[2, 0, 1, 0], [0, 0, 0, 1], [1, 1, 0, 0], [0, 2, 0, 0],
                      [1, 0, 0, 2], [0, 0, 1, 0], [2, 1, 0, 0]], np.float32)
LIST_WEIGHTS = np.array([[1.0], [2.0], [0.5], [1.5], [1.0], [3.0], [0.25]],
                        np.float32)


def numpy_ndcg_at_3(scores, relevance):
  """Per list: Σ_{rank<3} (2^rel - 1)/log2(rank + 2), over the ideal's."""
  def dcg(rel):
    return np.sum((2 ** rel[:3] - 1) / np.log2(np.arange(2, 2 + len(rel[:3]))))
  return np.array([dcg(r[np.argsort(-s)]) / dcg(np.sort(r)[::-1])
                   for s, r in zip(scores, relevance)])


def test_tf_ranking_ndcg_with_per_list_weights(session_config, caplog):
  tfr = pytest.importorskip("tensorflow_ranking")

  def model_fn(features, labels, mode):
    scores = features["scores"] * tf1.get_variable("scale", initializer=1.0)
    weights = tf.broadcast_to(features["weights"], tf.shape(scores))
    metrics = {"metric/ndcg@3": tfr.metrics.normalized_discounted_cumulative_gain(
        labels, scores, weights=weights, topn=3)}
    return tf.estimator.EstimatorSpec(mode, loss=tf.reduce_mean(scores),
                                      eval_metric_ops=metrics)

  def run(num_towers, relevance=RELEVANCE):
    with tf.Graph().as_default():
      fn = model_fn if num_towers is None else emg.multi_gpu(
          model_fn, devices=harness.cpu_devices(num_towers))
      spec = harness.call(fn, {"scores": tf.constant(LISTS), "weights":
                               tf.constant(LIST_WEIGHTS)},
                          tf.constant(relevance), EVAL, session_config)
      value, update = spec.eval_metric_ops["metric/ndcg@3"]
      with tf1.Session(config=session_config) as session:
        session.run([tf1.global_variables_initializer(),
                     tf1.local_variables_initializer()])
        session.run(update)
        return session.run(value)

  # Every list has a relevant item: the per-list weights are the user's.
  expected = np.average(numpy_ndcg_at_3(LISTS, RELEVANCE),
                        weights=LIST_WEIGHTS[:, 0])
  np.testing.assert_allclose(run(None), expected, rtol=1e-5)
  for num_towers in (2, 3):
    np.testing.assert_allclose(run(num_towers), expected, rtol=1e-5)
  # TF-Ranking's default weight for a list with no relevant item (the
  # batch's average) is computed inside the metric, which is built once from
  # the global batch (issue 39): one device's, with nothing to warn about.
  no_relevant = RELEVANCE.copy()
  no_relevant[1] = 0
  one_device = run(None, no_relevant)
  for num_towers in (2, 3):
    np.testing.assert_allclose(run(num_towers, no_relevant), one_device,
                               rtol=1e-5)
  assert "not one device's" not in caplog.text


def cross_tower_readout_model_fn(features, labels, mode):
  """A summary and a hook read a cross-tower sum that the loss does not use:
  they are fetched without the other towers' ops, whose matching collective
  must still run (else it waits for the 600 s timeout)."""
  w = tf1.get_variable("w", initializer=W0)
  loss = tf.reduce_mean(tf.square(tf.reduce_sum(features["x"] * w, 1) -
                                  labels))
  total = emg.cross_tower_sum(tf.reduce_sum(features["x"]))
  tf1.summary.scalar("x_total", total)
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.0))
  return tf.estimator.EstimatorSpec(
      mode, loss=loss, train_op=opt.minimize(loss, tf1.train.get_global_step()),
      training_hooks=[FetchHook(total)])


@pytest.mark.parametrize("num_towers", [2, 3])
def test_summary_and_hook_of_a_cross_tower_sum_alone_run(num_towers,
                                                         session_config):
  bounded = tf1.RunOptions(timeout_in_ms=120000)  # a hang fails, in 2 min.
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    x = tf1.placeholder(tf.float32, [None, 2])
    y = tf1.placeholder(tf.float32, [None])
    fn = emg.multi_gpu(cross_tower_readout_model_fn,
                       devices=harness.cpu_devices(num_towers))
    spec = harness.call(fn, {"x": x}, y, TRAIN, session_config)
    hook, = [h for h in spec.training_hooks if isinstance(h, FetchHook)]
    with tf1.Session(config=session_config) as session:
      session.run(tf1.global_variables_initializer())
      feed = {x: X[BATCHES[0]], y: Y[BATCHES[0]]}
      summary = tf1.Summary.FromString(session.run(
          tf1.summary.merge_all(), feed, options=bounded))
      fetched = session.run(hook.tensor, feed, options=bounded)
  expected = X[BATCHES[0]].sum()  # Σ over the towers = Σ over the batch.
  np.testing.assert_allclose(summary.value[0].simple_value, expected,
                             rtol=1e-5)
  np.testing.assert_allclose(fetched, expected, rtol=1e-5)
