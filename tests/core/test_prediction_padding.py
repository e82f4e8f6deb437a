"""Predictions whose other dimensions differ between towers are padded.

Greedy decoding that stops when every example of its batch is done (the
loop's condition: ops inside a tf.while_loop body stay on the shard) stops
at the shard's longest sequence, a detector keeps as many boxes as the
shard's busiest example: each tower's predictions are [nᵢ, Tᵢ, ...] with its
own Tᵢ. They are padded to the largest over the towers (one device's T, the
batch's longest) with `prediction_pad_value`, and each example's own
positions are compared with one device's. A step count computed before the
loop is the global batch's (contract 24): nothing to pad.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

from tests import harness

tf1 = tf.compat.v1
PREDICT = tf.estimator.ModeKeys.PREDICT
LENGTHS = np.array([2, 5, 1, 3, 4, 1, 2], np.int32)  # 7 examples: uneven.
STARTS = np.arange(7, dtype=np.int32) + 10


def _longest(length):
  return tf.reduce_max(tf.concat([length, [0]], axis=0))


def _decode(start, length, steps_first=False):
  """Greedy-decoding-like: ids start+t at step t < the example's length,
  0 after it; a tf.while_loop while some example of the batch is not done
  (the shard's longest sequence), or up to a step count computed first
  (`steps_first`: the global batch's longest)."""
  steps = _longest(length) if steps_first else None

  def body(t, ids):
    step = tf.where(t < length, start + t, tf.zeros_like(start))
    return t + 1, tf.concat([ids, step[:, None]], axis=1)

  _, ids = tf1.while_loop(
      lambda t, _: t < (_longest(length) if steps is None else steps), body,
      [0, tf.zeros([tf.shape(start)[0], 0], tf.int32)],
      shape_invariants=[tf.TensorShape([]), tf.TensorShape([None, None])])
  return ids  # [examples, steps]


def make_model_fn(steps_first=False):
  def model_fn(features, labels, mode):
    del labels
    ids = _decode(features["start"], features["length"], steps_first)
    boxes = tf.cast(tf.stack([ids] * 4, axis=-1), tf.float32) / 10.0
    words = tf.strings.as_string(ids)
    with tf1.variable_scope("head"):
      scale = tf1.get_variable("scale", [],
                               initializer=tf1.ones_initializer())
    return tf.estimator.EstimatorSpec(mode, predictions={
        "ids": ids, "boxes": boxes * scale, "words": words,
        "length": features["length"]})
  return model_fn


model_fn = make_model_fn()


def predict(towers, batch, fn=model_fn, **options):
  features = {"start": STARTS[:batch], "length": LENGTHS[:batch]}
  with tf.Graph().as_default():
    fn = fn if towers is None else emg.multi_gpu(
        fn, devices=harness.cpu_devices(towers), **options)
    config = emg.make_session_config(num_cpus=4)
    spec = harness.call(fn, tf.nest.map_structure(tf.constant, features),
                        None, PREDICT, config)
    with tf1.Session(config=config) as session:
      session.run(tf1.global_variables_initializer())
      return session.run(spec.predictions)


def own_positions(predictions, key):
  return [row[:length] for row, length in
          zip(predictions[key], predictions["length"])]


@pytest.mark.parametrize("towers,batch,variable_update", [
    (2, 7, "shared"), (3, 7, "replicated"), (3, 2, "shared")])
def test_each_example_is_one_devices(towers, batch, variable_update):
  want = predict(None, batch)
  got = predict(towers, batch, variable_update=variable_update)
  for key in ("ids", "boxes", "words"):
    assert got[key].shape == want[key].shape, key
    for mine, theirs in zip(own_positions(got, key), own_positions(want, key)):
      np.testing.assert_array_equal(mine, theirs, err_msg=key)
  # The default pads (0, 0.0, "") are what this decoder writes past an end.
  np.testing.assert_array_equal(got["ids"], want["ids"])
  assert set(got["words"][:, -1]) <= {b"", b"0"} | set(want["words"][:, -1])


def test_the_pad_value_is_the_users():
  """Tower 0 holds lengths [2, 5, 1] (its longest: 5), tower 1 [3, 4]
  (4) and tower 2 [1, 2] (2): past its tower's longest, a row holds the pad
  value; before it, the model_fn's 0."""
  got = predict(3, 7, prediction_pad_value={"ids": -1, "words": "<pad>"})
  longest = np.repeat([5, 4, 2], [3, 2, 2])
  for row, start, length, end in zip(got["ids"], STARTS, LENGTHS, longest):
    np.testing.assert_array_equal(row, [start + i if i < length else 0
                                        for i in range(end)] +
                                  [-1] * (5 - end))
  assert list(got["words"][5]) == [b"15", b"0", b"<pad>", b"<pad>", b"<pad>"]
  assert got["boxes"][5, 4].tolist() == [0.0] * 4  # no entry: the default.


def test_steps_counted_before_the_loop_are_the_global_batchs():
  """`reduce_max(length)` before the loop is the global batch's longest (5)
  in every tower: one device's predictions, no pad value in them."""
  fn = make_model_fn(steps_first=True)
  want = predict(None, 7, fn)
  got = predict(3, 7, fn, prediction_pad_value={"ids": -1, "words": "<pad>"})
  assert want["ids"].shape == (7, 5)
  for key in ("ids", "boxes", "words"):
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_a_pad_value_of_the_wrong_kind_names_the_prediction():
  with pytest.raises(ValueError, match=r"predictions\['words'\].*string"):
    predict(2, 7, prediction_pad_value=-1)


@pytest.mark.parametrize("value", [[0], {1: 0}, {"ids": [0]}, object()])
def test_prediction_pad_value_is_checked_when_wrapping(value):
  with pytest.raises(TypeError, match="prediction_pad_value"):
    emg.multi_gpu(model_fn, devices=2, prediction_pad_value=value)


def test_predictions_of_unknown_rank_are_joined_as_they_are():
  def unknown_rank(features, labels, mode):
    del labels
    ids = tf1.placeholder_with_default(features["start"], shape=None)
    return tf.estimator.EstimatorSpec(mode, predictions={"ids": ids})

  with tf.Graph().as_default():
    fn = emg.multi_gpu(unknown_rank, devices=harness.cpu_devices(2))
    config = emg.make_session_config(num_cpus=4)
    spec = harness.call(fn, {"start": tf.constant(STARTS)}, None, PREDICT,
                        config)
    with tf1.Session(config=config) as session:
      np.testing.assert_array_equal(session.run(spec.predictions["ids"]),
                                    STARTS)


@pytest.mark.parametrize("towers", [3])
def test_estimator_predict_yields_each_examples_own_ids(towers, run_config):
  """Estimator.predict in batches of 4 (the last one of 3 examples)."""
  def input_fn():
    return tf.data.Dataset.from_tensor_slices(
        {"start": STARTS, "length": LENGTHS}).batch(4)

  def predict_all(fn):
    est = tf.estimator.Estimator(fn, config=run_config)
    return list(est.predict(input_fn, yield_single_examples=True))

  want = predict_all(model_fn)
  got = predict_all(emg.multi_gpu(model_fn,
                                  devices=harness.cpu_devices(towers)))
  assert len(got) == len(want) == 7
  for mine, theirs in zip(got, want):
    length = theirs["length"]
    for key in ("ids", "boxes", "words"):
      np.testing.assert_array_equal(mine[key][:length], theirs[key][:length],
                                    err_msg=key)
