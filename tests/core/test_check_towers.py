"""emg.check_towers catches every silent mismatch of a model_fn and passes
the exact ones; str(report) names the cause and the fix."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

tf1 = tf.compat.v1
DEVICES = ["/cpu:0", "/cpu:1"]


def input_fn():
  rng = np.random.RandomState(0)
  x = rng.randn(7, 3).astype(np.float32)
  y = (rng.rand(7, 2) > 0.5).astype(np.float32)
  return tf.data.Dataset.from_tensors((x, y)).repeat()


def dense(x, units, name="lin"):
  return tf1.layers.dense(x, units, name=name, kernel_initializer=(
      tf1.glorot_uniform_initializer(seed=1)))


def spec(mode, loss, grads_fn=None):
  opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.5, 0.9))
  if grads_fn is None:
    train_op = opt.minimize(loss, tf1.train.get_global_step())
  else:
    grads, tvars = zip(*opt.compute_gradients(loss))
    train_op = opt.apply_gradients(zip(grads_fn(list(grads)), tvars),
                                   tf1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def mean_fn(features, labels, mode):
  return spec(mode, tf1.losses.mean_squared_error(labels, dense(features, 2)))


def summed_fn(features, labels, mode):
  return spec(mode, tf.reduce_sum(tf.square(dense(features, 2) - labels)))


def matches_fn(features, labels, mode):
  """Object Detection's normalize_loss_by_num_matches, per tower."""
  per_anchor = tf.square(dense(features, 2) - labels) * labels
  return spec(mode, tf.reduce_sum(per_anchor) / tf.reduce_sum(labels))


def clip_by_norm_fn(features, labels, mode):
  loss = tf1.losses.mean_squared_error(labels, dense(features, 2))
  return spec(mode, loss, lambda g: [tf.clip_by_norm(t, 0.01) for t in g])


def batch_size_param_fn(features, labels, mode, params):
  """TPUEstimator style: a sum divided by params['batch_size']."""
  per_example = tf.reduce_sum(tf.square(dense(features, 2) - labels), 1)
  return spec(mode, tf.reduce_sum(per_example) / params["batch_size"])


def global_clip_renamed_fn(features, labels, mode):
  loss = tf1.losses.mean_squared_error(labels, dense(features, 2))
  return spec(mode, loss, lambda g: tf.clip_by_global_norm(
      g, 0.01, name="grad_clip")[0])


def in_batch_negatives_fn(features, labels, mode):
  q, d = dense(features, 4, "q"), dense(labels, 4, "d")
  logits = tf.matmul(q, d, transpose_b=True)
  return spec(mode, tf1.losses.sparse_softmax_cross_entropy(
      tf.range(tf.shape(q)[0]), logits))


def keras_batch_norm_fn(features, labels, mode):
  h = tf.keras.layers.BatchNormalization(name="bn")(
      dense(features, 4), training=mode == "train")
  loss = tf1.losses.mean_squared_error(labels, dense(h, 2, "out"))
  with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
    return spec(mode, loss)


def test_an_exact_model_fn_passes():
  report = emg.check_towers(mean_fn, input_fn, DEVICES, steps=2)
  assert report.ok, str(report)
  assert {name for name, _ in report.worst} >= {"lin/kernel", "lin/bias",
                                                "global_step"}
  assert report.worst[0][1] <= 1e-5
  assert str(report).startswith("check_towers: OK: 2 towers")


# Patterns the global batch makes exact (global_batch=True, the default):
# their mismatches are caught where they still exist, the old path's.
# A sum over the shard under "mean" is made global (the tower's loss counts
# once); batch norm layers keep their shard's statistics (their warning).
EXACT_ON_THE_GLOBAL_BATCH = ("matches_fn", "in_batch_negatives_fn",
                             "summed_fn", "batch_size_param_fn")


@pytest.mark.parametrize("model_fn,cause,fix", [
    (summed_fn, "a sum over the tower's examples", "loss_reduction='sum'"),
    (batch_size_param_fn, "a sum over the tower's examples",
     "emg.global_ratio"),
    (global_clip_renamed_fn, "transforms each tower's gradients",
     "clip_gradients_by_norm="),
    (matches_fn, "divides by a count of the batch", "emg.global_ratio"),
    (clip_by_norm_fn, "transforms each tower's gradients",
     "clip_gradients_by_norm="),
    (in_batch_negatives_fn, "see each other", "emg.cross_tower_concat"),
    (keras_batch_norm_fn, "batch norm normalizes each tower's shard",
     "sync_batch_norm=True"),
])
def test_a_silent_mismatch_is_caught_and_explained(model_fn, cause, fix):
  options = {}
  if model_fn.__name__ in EXACT_ON_THE_GLOBAL_BATCH:
    assert emg.check_towers(model_fn, input_fn, DEVICES, steps=2,
                            params={"batch_size": 7}).ok
    options = {"global_batch": False}  # the old path's mismatch, to catch.
  report = emg.check_towers(model_fn, input_fn, DEVICES, steps=2,
                            params={"batch_size": 7}, **options)
  assert not report.ok
  assert report.worst[0][1] > 1e-4
  text = str(report)
  assert text.startswith("check_towers: MISMATCH")
  assert cause in text and fix in text, text


def test_the_fix_it_names_makes_the_towers_exact():
  assert emg.check_towers(summed_fn, input_fn, DEVICES, steps=2,
                          loss_reduction="sum").ok
  assert emg.check_towers(keras_batch_norm_fn, input_fn, DEVICES, steps=2,
                          sync_batch_norm=True).ok


def readout_fn(features, labels, mode, params):
  """An exact model whose eval metric, prediction and summary are batch
  statistics: naive (params['naive']) or through the cross-tower tools."""
  logits = dense(features, 2)
  err = tf.reduce_sum(tf.square(logits - (0.0 if labels is None else labels)),
                      1)
  if params["naive"]:
    centered = err - tf.reduce_mean(err)
    # A variance of the shard is no mean, sum, max or min: tower 0's on
    # the old path (global_batch=False), the global batch's by default.
    tf1.summary.scalar("error_variance", tf.math.reduce_variance(err))
  else:  # (a summary's collectives would not run in towers 1..: no max.)
    centered = err - emg.cross_tower_sum(tf.reduce_sum(err)) / (
        emg.cross_tower_sum(tf.cast(tf.size(err), tf.float32)))
  tf1.summary.scalar("mean_error", tf.reduce_mean(err))
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions={"centered":
                                                         centered})
  result = spec(mode, tf.reduce_mean(err))
  return result._replace(eval_metric_ops={
      "centered@abs": tf1.metrics.mean(tf.abs(centered)),
      "mean error": tf1.metrics.mean(tf.reduce_mean(err))})


def test_eval_predict_and_summaries_are_compared():
  report = emg.check_towers(readout_fn, input_fn, ["/cpu:0", "/cpu:1",
                                                   "/cpu:2"],
                            params={"naive": False})
  names = {name for name, _ in report.worst}
  assert {"eval/centered@abs", "eval/mean error", "predict/centered",
          "summary/mean_error"} <= names
  assert report.ok, str(report)
  naive = lambda **options: emg.check_towers(  # noqa: E731
      readout_fn, input_fn, ["/cpu:0", "/cpu:1", "/cpu:2"],
      params={"naive": True}, **options)
  report = naive()  # on the global batch (the default), naive is exact.
  assert report.ok, str(report)
  assert {"eval/centered@abs", "predict/centered",
          "summary/error_variance"} <= {name for name, _ in report.worst}
  report = naive(global_batch=False)  # the old path's mismatch, to catch.
  assert not report.ok
  differing = {name for name, diff in report.worst if diff > 1e-4}
  assert differing == {"eval/centered@abs", "predict/centered",
                       "summary/error_variance"}, report.worst
  text = str(report)
  assert "an eval metric differs" in text and "a prediction differs" in text
  assert "summary or hooked scalar differs" in text


def test_the_model_fn_is_wrapped_before_anything_trains(monkeypatch):
  """Bad options fail at once, and tf-slim's fixes (which wrapping applies)
  are in place for the one-device run as well."""
  from estimator_multigpu import check  # pylint: disable=g-import-not-at-top
  from estimator_multigpu import slim_compat  # pylint: disable=g-import-not-at-top
  order = []
  monkeypatch.setattr(slim_compat, "apply_all", lambda: order.append("fix"))
  monkeypatch.setattr(check, "_train", lambda *a: order.append("train"))
  with pytest.raises(ValueError, match="ema_decay"):
    emg.check_towers(mean_fn, input_fn, devices=["/cpu:0", "/cpu:1"],
                     ema_decay=1.5)
  assert "train" not in order  # refused before the one-device run.
  del order[:]
  with pytest.raises(Exception):  # the stub trains nothing to compare.
    emg.check_towers(mean_fn, input_fn, devices=["/cpu:0", "/cpu:1"])
  assert order[:2] == ["fix", "train"]
