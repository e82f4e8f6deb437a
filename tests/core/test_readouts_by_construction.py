"""Metrics and summaries built once from the global batch (issue 39).

Each metric API a model_fn calls — `tf.compat.v1.metrics.*`, a Keras
`Metric.update_state`, tf-slim's `metrics.*`, a `TPUEstimatorSpec`'s
`eval_metrics` — is built once, in tower 0, from the towers' inputs joined
into the global batch's; so any metric, whatever ops it uses, is one
device's. Summaries likewise. Each case runs 13 examples in batches of 5, 5,
2 and 1 (the last is smaller than 2 and 3 towers: empty shards) through a
plain session, unwrapped and on 2 and 3 towers, and compares to one device
(1e-5); the one-device values are checked against numpy where the formula is
short.
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_slim

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
EVAL, TRAIN = tf.estimator.ModeKeys.EVAL, tf.estimator.ModeKeys.TRAIN
RNG = np.random.RandomState(7)
N = 13
X = RNG.randn(N, 2).astype(np.float32)
Y = RNG.randn(N).astype(np.float32)
C = RNG.randint(0, 3, N).astype(np.int64)       # class labels, 3 classes.
WT = RNG.rand(N).astype(np.float32)
W0 = np.array([[0.5, -1.0, 0.3], [0.2, 0.4, -0.7]], np.float32)
BATCHES = [slice(0, 5), slice(5, 10), slice(10, 12), slice(12, 13)]
LOGITS = X @ W0
PRED = LOGITS.argmax(1)


def _logits(features):
  w = tf1.get_variable("w", initializer=W0)
  return tf.matmul(features["x"], w)


def metrics_model_fn(features, labels, mode):
  """Metrics in several spellings: v1, Keras objects, tf-slim, raw shapes."""
  logits = _logits(features)
  classes = tf.argmax(logits, 1)
  probs = tf.nn.softmax(logits)
  onehot = tf.one_hot(labels, 3)
  per_example = tf1.losses.softmax_cross_entropy(
      onehot, logits, reduction=tf1.losses.Reduction.NONE)
  loss = tf.reduce_mean(per_example)
  keras_auc = tf.keras.metrics.AUC(num_thresholds=50)
  keras_auc.update_state(onehot, probs)
  keras_loss = tf.keras.metrics.Mean(name="keras_loss")
  keras_loss.update_state(loss)
  keras_acc = tf.keras.metrics.SparseCategoricalAccuracy()
  keras_acc.update_state(labels, probs, sample_weight=features["wt"])
  batch = tf.shape(features["x"])[0]
  metrics = {
      "mean_iou": tf1.metrics.mean_iou(labels, classes, 3),
      "per_class": tf1.metrics.mean_per_class_accuracy(labels, classes, 3),
      "auc": tf1.metrics.auc(onehot, probs),
      "precision_at_2": tf1.metrics.precision_at_k(labels, logits, 2),
      "accuracy_weighted": tf1.metrics.accuracy(labels, classes,
                                                weights=features["wt"]),
      "keras_auc": keras_auc,
      "keras_loss": keras_loss,
      "keras_acc": keras_acc,
      "slim_mean_iou": tf_slim.metrics.streaming_mean_iou(classes, labels, 3),
      "slim_pearson": tf_slim.metrics.streaming_pearson_correlation(
          logits[:, 0], tf.cast(labels, tf.float32)),
      "loss": tf1.metrics.mean(loss),
      "loss_as_1": tf1.metrics.mean(tf.reshape(loss, [1])),
      "loss_tiled": tf1.metrics.mean(tf.fill([batch], loss)),
      "constant": tf1.metrics.mean(tf.constant(3.0)),
      "batch_size": tf1.metrics.mean(batch),
      "batch_size_float": tf1.metrics.mean(tf.cast(batch, tf.float32)),
      "max_loss": tf1.metrics.mean(tf.reduce_max(per_example)),
  }
  return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)


def evaluate(model_fn, num_towers, batches=BATCHES, runs=1, wrapped=None):
  """{metric: [value per run]}, each run from fresh metric state
  (`wrapped`: the model_fn already wrapped)."""
  config = emg.make_session_config(num_cpus=4)
  with tf.Graph().as_default():
    x = tf1.placeholder(tf.float32, [None, 2])
    c = tf1.placeholder(tf.int64, [None])
    wt = tf1.placeholder(tf.float32, [None])
    fn = wrapped or (model_fn if num_towers is None else emg.multi_gpu(
        model_fn, devices=harness.cpu_devices(num_towers)))
    spec = harness.call(fn, {"x": x, "wt": wt}, c, EVAL, config)
    if hasattr(spec, "as_estimator_spec"):  # one device, a TPU spec.
      spec = spec.as_estimator_spec()
    updates = [u for _, u in spec.eval_metric_ops.values()]
    values = {k: v for k, (v, _) in spec.eval_metric_ops.items()}
    results = {k: [] for k in values}
    with tf1.Session(config=config) as session:
      session.run(tf1.global_variables_initializer())
      for _ in range(runs):
        session.run(tf1.local_variables_initializer())
        for rows in batches:
          session.run(updates, {x: X[rows], c: C[rows], wt: WT[rows]})
        for key, value in session.run(values).items():
          results[key].append(value)
  return results


@pytest.fixture(scope="module")
def one_device():
  return {k: v[0] for k, v in evaluate(metrics_model_fn, None).items()}


def _numpy_mean_iou(labels, pred, k=3):
  ious = []
  for c in range(k):
    inter = np.sum((labels == c) & (pred == c))
    union = np.sum((labels == c) | (pred == c))
    if union:
      ious.append(inter / union)
  return np.mean(ious)


def test_one_device_is_numpy(one_device):
  loss_per_batch = []
  for rows in BATCHES:
    z = LOGITS[rows] - LOGITS[rows].max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    loss_per_batch.append(-logp[np.arange(len(z)), C[rows]].mean())
  np.testing.assert_allclose(one_device["mean_iou"],
                             _numpy_mean_iou(C, PRED), rtol=1e-5)
  np.testing.assert_allclose(
      one_device["accuracy_weighted"],
      np.sum(WT * (PRED == C)) / WT.sum(), rtol=1e-5)
  for key in ("loss", "loss_as_1", "keras_loss"):
    np.testing.assert_allclose(one_device[key], np.mean(loss_per_batch),
                               rtol=1e-5, err_msg=key)
  # tiled: each batch's loss once per example, so weighted by batch sizes.
  sizes = [r.stop - r.start for r in BATCHES]
  np.testing.assert_allclose(one_device["loss_tiled"],
                             np.average(loss_per_batch, weights=sizes),
                             rtol=1e-5)
  assert one_device["constant"] == 3.0
  np.testing.assert_allclose(one_device["batch_size"], np.mean(sizes))


@pytest.mark.parametrize("num_towers", [2, 3])
def test_every_metric_is_one_devices(num_towers, one_device):
  towers = evaluate(metrics_model_fn, num_towers)
  for key, expected in one_device.items():
    np.testing.assert_allclose(towers[key][0], expected, rtol=1e-5,
                               atol=1e-6, err_msg=key)


def test_repeated_evaluations_give_the_same_value(one_device):
  """The same data 30 times: the same value every time (no race)."""
  towers = evaluate(metrics_model_fn, 2, runs=30)
  for key in ("constant", "loss", "batch_size", "mean_iou"):
    np.testing.assert_allclose(towers[key], [one_device[key]] * 30,
                               rtol=1e-5, err_msg=key)


# ------------------------------------------------ TPUEstimatorSpec
def tpu_model_fn(features, labels, mode, params):
  """A TPU-style model_fn: `eval_metrics=(metric_fn, tensors)`, and a
  `host_call` summary of the loss as a [1] tensor (how TPU code passes it)."""
  del params
  logits = _logits(features)
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)

  def metric_fn(labels, logits, loss_1):
    # Its own state variables and assignments: built once on the global
    # batch, it needs no inference.
    total = tf1.get_local_variable("hits", [], tf.float32,
                                   initializer=tf1.zeros_initializer())
    hits = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), labels),
                                 tf.float32))
    return {"iou": tf1.metrics.mean_iou(labels, tf.argmax(logits, 1), 3),
            "loss": tf1.metrics.mean(loss_1),
            "hits": (tf.identity(total), tf1.assign_add(total, hits))}

  from tensorflow_estimator.python.estimator.tpu import tpu_estimator
  return tpu_estimator.TPUEstimatorSpec(
      mode, loss=loss, eval_metrics=(metric_fn, {
          "labels": labels, "logits": logits,
          "loss_1": tf.reshape(loss, [1])}))


@pytest.mark.parametrize("num_towers", [2, 3])
def test_tpu_eval_metrics_called_once_on_the_global_batch(num_towers):
  want = {k: v[0] for k, v in evaluate(tpu_model_fn, None).items()}
  np.testing.assert_allclose(want["hits"], np.sum(PRED == C))
  np.testing.assert_allclose(want["iou"], _numpy_mean_iou(C, PRED),
                             rtol=1e-5)
  got = evaluate(tpu_model_fn, num_towers)
  for key, expected in want.items():
    np.testing.assert_allclose(got[key][0], expected, rtol=1e-5, err_msg=key)


# ------------------------------------------------ summaries
def summary_model_fn(features, labels, mode):
  """Summaries of the loss and of shard statistics, v1 and TF2."""
  logits = _logits(features)
  per_example = tf1.losses.sparse_softmax_cross_entropy(
      labels, logits, reduction=tf1.losses.Reduction.NONE)
  loss = tf.reduce_mean(per_example)
  tf1.summary.scalar("loss", loss)
  tf1.summary.scalar("loss_1", tf.reshape(loss, []))
  tf1.summary.scalar("err_sum", tf.reduce_sum(per_example))
  tf1.summary.scalar("err_max", tf.reduce_max(per_example))
  tf1.summary.scalar("err_min", tf.math.reduce_min(per_example))
  tf1.summary.scalar("batch", tf.cast(tf.shape(logits)[0], tf.float32))
  tf1.summary.scalar("mean_of_means", 0.5 * (tf.reduce_mean(logits[:, 0]) +
                                             tf.reduce_mean(logits[:, 1])))
  tf1.summary.histogram("per_example", per_example)
  # The canned estimators' hidden-layer summary (its tf.cond hid the kind).
  tf1.summary.scalar("relu_zeros", tf.math.zero_fraction(tf.nn.relu(logits)))
  tf1.summary.scalar("shifted_zeros", tf.nn.zero_fraction(logits - 0.5))
  # Ratios of statistics: of two means; the loss over a count (canned
  # heads' average_loss is their loss over the weights' sum).
  tf1.summary.scalar("mean_ratio", tf.reduce_mean(logits[:, 0]) /
                     tf.reduce_mean(tf.abs(logits[:, 1]) + 1.0))
  tf1.summary.scalar("loss_per_row", loss / tf.reduce_sum(
      tf.ones_like(per_example)))
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.0))
  return tf.estimator.EstimatorSpec(
      mode, loss=loss,
      train_op=opt.minimize(loss, tf1.train.get_global_step()))


def _summaries(num_towers, mode, rows):
  config = emg.make_session_config(num_cpus=4)
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    x = tf1.placeholder(tf.float32, [None, 2])
    c = tf1.placeholder(tf.int64, [None])
    fn = summary_model_fn if num_towers is None else emg.multi_gpu(
        summary_model_fn, devices=harness.cpu_devices(num_towers))
    harness.call(fn, {"x": x}, c, mode, config)
    with tf1.Session(config=config) as session:
      session.run(tf1.global_variables_initializer())
      proto = tf1.Summary.FromString(session.run(
          tf1.summary.merge_all(), {x: X[rows], c: C[rows]}))
  read = {}
  for value in proto.value:
    read[value.tag] = (value.simple_value if value.HasField("simple_value")
                       else (value.histo.num, value.histo.sum))
  return read


@pytest.mark.parametrize("mode", [TRAIN, EVAL])
@pytest.mark.parametrize("num_towers,rows", [(2, slice(0, 5)),
                                             (3, slice(0, 5)),
                                             (3, slice(5, 7))])
def test_summaries_read_the_global_batch(mode, num_towers, rows):
  z = LOGITS[rows] - LOGITS[rows].max(1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(1, keepdims=True))
  per_example = -logp[np.arange(len(z)), C[rows]]
  want = {"loss": per_example.mean(), "loss_1": per_example.mean(),
          "err_sum": per_example.sum(), "err_max": per_example.max(),
          "err_min": per_example.min(), "batch": len(per_example),
          "mean_of_means": LOGITS[rows][:, :2].mean(),
          "per_example": (len(per_example), per_example.sum()),
          "relu_zeros": np.mean(LOGITS[rows] <= 0),
          "shifted_zeros": np.mean(LOGITS[rows] == 0.5),
          "mean_ratio": LOGITS[rows][:, 0].mean() / (
              np.abs(LOGITS[rows][:, 1]) + 1).mean(),
          "loss_per_row": per_example.mean() / len(per_example)}
  one = _summaries(None, mode, rows)
  got = _summaries(num_towers, mode, rows)
  for tag, expected in want.items():
    np.testing.assert_allclose(one[tag], expected, rtol=1e-5, err_msg=tag)
    np.testing.assert_allclose(got[tag], expected, rtol=1e-5, err_msg=tag)


# ------------------------------------------------ TF2 summaries, host_call
def _written(graph_ops, tag):
  """The tensors TF2 summary ops named `tag` write."""
  def name(op):
    return tf.get_static_value(op.inputs[3]).item().decode()
  return [op.inputs[2] for op in graph_ops
          if op.type == "WriteSummary" and tag in name(op)]


def tf2_summary_model_fn(features, labels, mode, params):
  logits = _logits(features)
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
  step = tf1.train.get_or_create_global_step()
  if params.get("host_call"):
    from tensorflow_estimator.python.estimator.tpu import tpu_estimator

    def host_call_fn(gs, loss_1, logits):
      tf.summary.scalar("host_loss", loss_1[0], step=gs[0])
      tf.summary.histogram("host_logits", logits, step=gs[0])
      return tf1.summary.all_v2_summary_ops()
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.0))
    return tpu_estimator.TPUEstimatorSpec(
        mode, loss=loss, train_op=opt.minimize(loss, step),
        host_call=(host_call_fn, [tf.reshape(step, [1]),
                                  tf.reshape(loss, [1]), logits]))
  tf.summary.scalar("tf2_loss", loss, step=step)
  tf.summary.scalar("tf2_max", tf.reduce_max(logits), step=step)
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.0))
  return tf.estimator.EstimatorSpec(mode, loss=loss,
                                    train_op=opt.minimize(loss, step))


@pytest.mark.parametrize("host_call", [False, True])
@pytest.mark.parametrize("num_towers", [2, 3])
def test_tf2_summaries_and_host_call_read_the_global_batch(
    num_towers, host_call, tmp_path):
  pytest.importorskip("tensorboard", reason="tf.summary.scalar needs it")
  rows = slice(0, 5)
  z = LOGITS[rows] - LOGITS[rows].max(1, keepdims=True)
  loss = -(z - np.log(np.exp(z).sum(1, keepdims=True)))[
      np.arange(5), C[rows]].mean()
  config = emg.make_session_config(num_cpus=4)
  with tf.Graph().as_default() as graph:
    fn = emg.multi_gpu(tf2_summary_model_fn,
                       devices=harness.cpu_devices(num_towers))
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default(), tf.summary.record_if(True):
      spec = fn({"x": tf.constant(X[rows])}, tf.constant(C[rows]), TRAIN,
                {"host_call": host_call}, harness.config_for(config))
    tags = ({"host_loss": loss} if host_call else
            {"tf2_loss": loss, "tf2_max": LOGITS[rows].max()})
    with tf1.Session(config=config) as session:
      session.run(tf1.global_variables_initializer())
      for tag, expected in tags.items():
        written = _written(graph.get_operations(), tag)
        assert len(written) == 1, tag   # once, not once per tower.
        np.testing.assert_allclose(session.run(written[0]), expected,
                                   rtol=1e-5, err_msg=tag)
      if host_call:
        histogram = _written(graph.get_operations(), "host_logits")
        assert len(histogram) == 1
        # tensorboard's histogram buckets of the global batch's 15 logits.
        np.testing.assert_allclose(session.run(histogram[0])[:, 2].sum(), 15)
    del spec


# ------------------------------------------------ what is still inferred
def hand_made_metric_model_fn(features, labels, mode):
  """A metric that builds its own state and assignment outside the APIs."""
  logits = _logits(features)
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
  total = tf1.get_local_variable("hits", [], tf.float32,
                                 initializer=tf1.zeros_initializer())
  hits = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), labels),
                               tf.float32))
  return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={
      "hand_made": (tf.identity(total), tf1.assign_add(total, hits))})


def test_hand_made_metric_is_inferred_and_warned_once_per_model(caplog):
  want = evaluate(hand_made_metric_model_fn, None)["hand_made"][0]
  np.testing.assert_allclose(want, np.sum(PRED == C))
  # per-example sums: the inference makes it exact, and says it inferred.
  wrapped = emg.multi_gpu(hand_made_metric_model_fn,
                          devices=harness.cpu_devices(2))
  for _ in range(2):   # the same wrapped model_fn built twice: one warning.
    got = evaluate(None, 2, wrapped=wrapped)["hand_made"][0]
    np.testing.assert_allclose(got, want)
  assert caplog.text.count("'hand_made' updates its own state") == 1

  evaluate(hand_made_metric_model_fn, 3)   # another wrapped model_fn.
  assert caplog.text.count("'hand_made' updates its own state") == 2


def test_estimator_add_metrics_sees_the_global_batch(run_config):
  """`tf.estimator.add_metrics` runs its metric_fn on the merged spec."""
  def input_fn():
    return tf.data.Dataset.from_tensor_slices(({"x": X, "wt": WT}, C)).batch(5)

  def metric_fn(labels, predictions):
    return {"iou": tf1.metrics.mean_iou(labels, predictions["classes"], 3)}

  def model_fn(features, labels, mode):
    logits = _logits(features)
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    return tf.estimator.EstimatorSpec(
        mode, loss=loss, predictions={"classes": tf.argmax(logits, 1)})
  est = tf.estimator.add_metrics(tf.estimator.Estimator(
      emg.multi_gpu(model_fn, devices=harness.cpu_devices(3)),
      config=run_config), metric_fn)
  with tf.Graph().as_default():   # a checkpoint of W0 to evaluate.
    _logits({"x": tf.constant(X)})
    tf1.train.get_or_create_global_step()
    with tf1.Session() as session:
      session.run(tf1.global_variables_initializer())
      tf1.train.Saver().save(session, run_config.model_dir + "/model.ckpt")
  result = est.evaluate(input_fn)
  np.testing.assert_allclose(result["iou"], _numpy_mean_iou(C, PRED),
                             rtol=1e-5)


def ratio_model_fn(features, labels, mode):
  """Batch-level inputs that are ratios of sums: a weighted mean, a sum over
  the batch size (how canned heads reduce their losses)."""
  logits = _logits(features)
  err = tf.square(logits[:, 0] - tf.cast(labels, tf.float32))
  wt = features["wt"]
  weighted = tf.reduce_sum(err * wt) / tf.reduce_sum(wt)
  over_size = tf.math.divide_no_nan(tf.reduce_sum(err), tf.cast(
      tf.size(err), tf.float32))
  keras_mean = tf.keras.metrics.Mean()
  keras_mean.update_state(weighted)
  return tf.estimator.EstimatorSpec(mode, loss=over_size, eval_metric_ops={
      "weighted": tf1.metrics.mean(weighted), "keras_weighted": keras_mean,
      "over_size": tf1.metrics.mean(over_size)})


@pytest.mark.parametrize("num_towers", [2, 3])
def test_ratios_of_sums_are_the_global_batchs(num_towers):
  err = (LOGITS[:, 0] - C) ** 2
  weighted = [np.sum(err[r] * WT[r]) / WT[r].sum() for r in BATCHES]
  want = evaluate(ratio_model_fn, None)
  np.testing.assert_allclose(want["weighted"][0], np.mean(weighted),
                             rtol=1e-5)
  got = evaluate(ratio_model_fn, num_towers)
  for key, value in want.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-5, err_msg=key)


# ------------------------------------------------ what is warned, by name
def statistics_model_fn(features, labels, mode):
  """Shard statistics of every kind fed to metrics and summaries."""
  logits = _logits(features)
  per = tf1.losses.sparse_softmax_cross_entropy(
      labels, logits, reduction=tf1.losses.Reduction.NONE)
  hits = tf.equal(tf.argmax(logits, 1), labels)
  tf1.summary.scalar("per_variance", tf.math.reduce_variance(per))
  loss = tf.reduce_mean(per)
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.0))
  train_op = opt.minimize(loss, tf1.train.get_or_create_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                    eval_metric_ops={
      "hits": tf1.metrics.mean(tf.math.count_nonzero(hits, dtype=tf.int32)),
      "any_hit": tf1.metrics.mean(tf.cast(tf.reduce_any(hits), tf.float32)),
      "variance": tf1.metrics.mean(tf.math.reduce_variance(per)),
      "masked": tf1.metrics.mean(tf.reduce_mean(tf.boolean_mask(per, hits))),
      "first_two": tf1.metrics.mean(tf.reduce_mean(per[:2])),
      "centered": tf1.metrics.mean(per - tf.reduce_mean(per)),
      "time_major": tf1.metrics.mean(tf.transpose(tf.stack([per] * 4, 1))),
  })


def summaries(model_fn, num_towers):
  """{tag: value} of the TRAIN graph's merged summaries on the first 5
  examples, unwrapped or on towers."""
  config = emg.make_session_config(num_cpus=4)
  with tf.Graph().as_default():
    fn = model_fn if num_towers is None else emg.multi_gpu(
        model_fn, devices=harness.cpu_devices(num_towers))
    harness.call(fn, {"x": tf.constant(X[:5]), "wt": tf.constant(WT[:5])},
                 tf.constant(C[:5]), TRAIN, config)
    merged = tf1.summary.merge_all()
    with tf1.Session(config=config) as session:
      session.run(tf1.global_variables_initializer())
      summary = tf1.Summary.FromString(session.run(merged))
  return {v.tag: v.simple_value for v in summary.value}


@pytest.mark.parametrize("num_towers", [2, 3])
def test_statistics_are_combined_or_warned_by_name(num_towers, caplog):
  """A count, any, variance, mean of a mask, of the first rows, centered:
  on the global batch (global_batch=True), one device's and not warned.
  Per-example values whose batch is not the first axis are warned."""
  want = evaluate(statistics_model_fn, None)
  got = evaluate(statistics_model_fn, num_towers)
  hits = [np.sum(PRED[r] == C[r]) for r in BATCHES]
  np.testing.assert_allclose(want["hits"][0], np.mean(hits))
  # Batches 3 and 4 have no hits: one device's mean of nothing is NaN.
  assert np.isnan(want["masked"][0]) and hits[2:] == [0, 0]
  for key in ("hits", "any_hit", "variance", "masked", "first_two",
              "centered"):
    np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6,
                               err_msg=key)
    assert f"eval metric {key!r}" not in caplog.text, key
  assert "eval metric 'time_major'" in caplog.text
  first_two_batches = BATCHES[:2]   # with hits (and shards without).
  np.testing.assert_allclose(
      evaluate(statistics_model_fn, num_towers,
               batches=first_two_batches)["masked"],
      evaluate(statistics_model_fn, None,
               batches=first_two_batches)["masked"], rtol=1e-5)
  summary = summaries(statistics_model_fn, num_towers)
  np.testing.assert_allclose(summary["per_variance"], summaries(
      statistics_model_fn, None)["per_variance"], rtol=1e-5)
  assert "summary 'per_variance'" not in caplog.text
