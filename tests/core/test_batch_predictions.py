"""Predictions computed over the batch are one device's, whatever op spells
them (issues 40, 50).

A prediction that depends on a reduction over the batch dimension (a softmax
or top_k over axis 0, a division by the batch's sum or max, ranks by
argsort, a cumulative sum over the batch) is computed on the global batch
(`global_batch=True`, the default): each key equals the unwrapped model_fn's
on one device, with no WARNING. Where the statistic still is the shard's (a
`tf.while_loop` computes it: loops are not rewritten), `multi_gpu` finds it
from the graph's dataflow and logs one WARNING naming the key and the fix
(the cross-tower tools, exact: `test_what_users_read`); a per-example
prediction is not warned about.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
X = np.random.RandomState(4).randn(5, 2).astype(np.float32)

COUPLED = {
    "nn_softmax_axis0": lambda s: tf.nn.softmax(s[:, None], axis=0)[:, 0],
    "v1_softmax_dim0": lambda s: tf1.nn.softmax(s[:, None], dim=0)[:, 0],
    "raw_softmax_reshaped": lambda s: tf.reshape(tf.raw_ops.Softmax(
        logits=tf.reshape(s, [1, -1])), [-1]),
    "raw_softmax_expanded": lambda s: tf.raw_ops.Softmax(
        logits=tf.expand_dims(s, 0))[0],
    "keras_softmax": lambda s: tf.keras.activations.softmax(s[None, :])[0],
    "raw_log_softmax_transposed": lambda s: tf.raw_ops.LogSoftmax(
        logits=tf.transpose(s[:, None]))[0],
    "hand_written_softmax": lambda s: tf.exp(s) / tf.reduce_sum(tf.exp(s)),
    "ranks_by_argsort": lambda s: tf.argsort(tf.argsort(-s)),
    "sorted": lambda s: tf.sort(s),
    "top_k_indices": lambda s: tf.scatter_nd(
        tf.math.top_k(s, 2).indices[:, None], tf.ones([2]), tf.shape(s)),
    "top_k_threshold": lambda s: s >= tf.math.top_k(s, 2).values[-1],
    "over_batch_max": lambda s: s / tf.reduce_max(s),
    "over_batch_sum_axis0": lambda s: s / tf.reduce_sum(s, 0, keepdims=True),
    "cumulative_sum": lambda s: tf.cumsum(s),
}
PER_EXAMPLE = {
    "softmax_over_classes": lambda s: tf.nn.softmax(tf.stack([s, -s], 1)),
    "top_k_over_classes": lambda s: tf.math.top_k(tf.stack([s, -s, 2 * s],
                                                           1), 2).indices,
    "scaled": lambda s: 2.0 * s + 1.0,
}


def model_fn(features, labels, mode, params):
  del labels
  w = tf1.get_variable("w", initializer=np.array([0.5, -1.0], np.float32))
  scores = tf.reduce_sum(features["x"] * w, 1)
  return tf.estimator.EstimatorSpec(mode, predictions={
      key: fn(scores) for key, fn in params["predictions"].items()})


def build(predictions, num_towers, session_config, static):
  """Builds the PREDICT graph, unwrapped (`num_towers` None) or on towers;
  a `static` batch of 5, or one of unknown size (cut 3/2 or 2/2/1 alike).

  Returns:
    The spec's predictions.
  """
  dataset = (tf.data.Dataset.from_tensors(X) if static else
             tf.data.Dataset.from_tensor_slices(X).batch(5))
  x = tf1.data.make_one_shot_iterator(dataset.repeat()).get_next()
  params = {"predictions": predictions}
  if num_towers is None:
    return model_fn({"x": x}, None, tf.estimator.ModeKeys.PREDICT,
                    params).predictions
  fn = emg.multi_gpu(model_fn, devices=harness.cpu_devices(num_towers))
  return fn({"x": x}, None, tf.estimator.ModeKeys.PREDICT, params,
            harness.config_for(session_config)).predictions


def predict(predictions, num_towers, session_config, static=True):
  """The predictions' values (see `build`)."""
  with tf.Graph().as_default():
    tensors = build(predictions, num_towers, session_config, static)
    with tf1.Session(config=session_config) as session:
      session.run(tf1.global_variables_initializer())
      return session.run(tensors)


@pytest.mark.parametrize("num_towers,static", [(2, True), (3, False)])
def test_every_spelling_of_a_batch_prediction_is_one_devices(
    num_towers, static, session_config, caplog):
  predictions = dict(COUPLED, **PER_EXAMPLE)
  want = predict(predictions, None, session_config)
  got = predict(predictions, num_towers, session_config, static)
  for key in predictions:
    assert np.shape(got[key]) == np.shape(want[key]), key
    np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6,
                               err_msg=key)
  assert "couples the examples" not in caplog.text


def test_a_statistic_of_the_shard_a_loop_computes_is_warned_once(
    session_config, caplog):
  """A loop's body is kept per shard as written: s / Σ(shard) is each
  tower's own, warned about once; the per-example keys are not."""
  def loop_sum(s):
    return tf1.while_loop(lambda i, total: i < 1, lambda i, total: (
        i + 1, total + tf.reduce_sum(s)), (0, 0.0))[1]
  with tf.Graph().as_default():
    build(dict(PER_EXAMPLE, over_loop_sum=lambda s: s / loop_sum(s)), 3,
          session_config, static=False)
  assert caplog.text.count("prediction 'over_loop_sum' couples the "
                           "examples") == 1
  for key in PER_EXAMPLE:
    assert f"prediction {key!r}" not in caplog.text, key
  assert "emg.cross_tower_concat" in caplog.text


def test_ops_over_time_in_a_time_major_tensor_are_not_warned(session_config,
                                                              caplog):
  """Axis 0 of a [time, batch, units] tensor is time: a cumulative sum or a
  softmax over time is per example."""
  time_major = lambda s: tf.stack([s, 2 * s, 3 * s])[:, :, None]  # noqa: E731
  with tf.Graph().as_default():
    build({"cumsum_over_time": lambda s: tf.cumsum(time_major(s), axis=0),
           "softmax_over_time": lambda s: tf.nn.softmax(time_major(s),
                                                        axis=0),
           "raw_softmax_over_time": lambda s: tf.raw_ops.Softmax(
               logits=tf.transpose(time_major(s), [2, 1, 0]))},
          2, session_config, static=False)
  assert "couples the examples" not in caplog.text
