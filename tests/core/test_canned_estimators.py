"""TF2 canned estimators on 2 and 3 towers, their own optimizers (issue 32).

`tf.estimator.Estimator(emg.multi_gpu(devices=...)(canned.model_fn))` trains,
evaluates (every metric of the heads) and predicts like the unwrapped canned
estimator on one device, to 1e-5, with its default optimizers unchanged:
DNNClassifier (Adagrad), LinearClassifier (Ftrl, sparse gradients of a
categorical column), DNNLinearCombinedClassifier (Ftrl + Adagrad, two
optimizer calls, Ftrl's own `iterations` variable) and DNNEstimator with a
MultiHead and an Adam instance shared by the towers (its bias correction
reads the global step).

Same initial values by construction: the one-device canned estimator trains
one step and both runs continue from a copy of that checkpoint (every
variable, slots and global_step included; the N-tower graph restoring it also
proves its variable names are one device's). Uneven shards: training batches
of 5 (3/2 on 2 towers, 2/2/1 on 3), evaluation and prediction on 11 examples
in batches of 4 (..., 2/1 and 1/1/1).
"""

import shutil

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

fc = tf.feature_column
RNG = np.random.RandomState(0)
X = RNG.randn(11, 2).astype(np.float32)
CATEGORY = np.array(list("abcabcaabcb"))
LABEL = (X[:, 0] + RNG.randn(11) > 0).astype(np.int64)[:, None]
TARGET = RNG.randn(11, 1).astype(np.float32)
KINDS = ("dnn", "linear", "combined", "multihead")


def input_fn(kind, batch, examples=11):
  labels = ({"a": LABEL, "b": TARGET} if kind == "multihead" else LABEL)
  features = {"x": X, "c": CATEGORY}
  data = tf.nest.map_structure(lambda a: a[:examples], (features, labels))
  return lambda: tf.data.Dataset.from_tensor_slices(data).batch(batch)


def canned_estimator(kind, config):
  """A canned estimator with tiny feature columns (its own optimizers)."""
  x = fc.numeric_column("x", shape=[2])
  c = fc.categorical_column_with_vocabulary_list("c", ["a", "b", "c"])
  if kind == "dnn":
    return tf.estimator.DNNClassifier([3], [x, fc.indicator_column(c)],
                                      config=config)
  if kind == "linear":
    return tf.estimator.LinearClassifier([x, c], config=config)
  if kind == "combined":
    return tf.estimator.DNNLinearCombinedClassifier(
        linear_feature_columns=[c], dnn_feature_columns=[x],
        dnn_hidden_units=[3], config=config)
  head = tf.estimator.MultiHead([tf.estimator.BinaryClassHead(name="a"),
                                 tf.estimator.RegressionHead(name="b")])
  return tf.estimator.DNNEstimator(
      head, [3], [x], optimizer=tf.keras.optimizers.legacy.Adam(0.05),
      config=config)


def run(estimator, kind) -> dict:
  """Trains 2 steps, then reads the variables, metrics and predictions."""
  estimator.train(input_fn(kind, 5, examples=10), steps=2)
  return {
      "variables": {name: estimator.get_variable_value(name)
                    for name in estimator.get_variable_names()},
      "metrics": estimator.evaluate(input_fn(kind, 4)),
      "predictions": list(estimator.predict(input_fn(kind, 4))),
  }


def config_in(model_dir, session_config):
  return tf.estimator.RunConfig(model_dir=str(model_dir),
                                session_config=session_config,
                                tf_random_seed=1, save_summary_steps=1000,
                                log_step_count_steps=1000)


@pytest.fixture(scope="module")
def start(tmp_path_factory):
  """Per kind: the checkpoint of one step on one device, and one device's
  run from it (built once for every tower count)."""
  cache = {}
  session_config = emg.make_session_config(num_cpus=3)

  def get(kind):
    if kind not in cache:
      root = tmp_path_factory.mktemp(kind)
      canned_estimator(kind, config_in(root / "start", session_config)).train(
          input_fn(kind, 5), steps=1)
      shutil.copytree(root / "start", root / "one")
      one = canned_estimator(kind, config_in(root / "one", session_config))
      cache[kind] = (root / "start", run(one, kind))
    return cache[kind]

  return get


def assert_close(actual, expected, what):
  assert sorted(actual) == sorted(expected), what
  for key, value in expected.items():
    value = np.asarray(value)
    if value.dtype.kind in "fiu":
      np.testing.assert_allclose(actual[key], value, rtol=1e-5, atol=1e-5,
                                 err_msg=f"{what} {key}")
    else:
      np.testing.assert_array_equal(actual[key], value, f"{what} {key}")


@pytest.mark.parametrize("num_towers", [2, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_canned_estimator_on_towers_is_one_device(start, tmp_path, kind,
                                                  num_towers):
  checkpoint, one = start(kind)
  shutil.copytree(checkpoint, tmp_path / "many")
  canned = canned_estimator(kind, config_in(
      tmp_path / "many", emg.make_session_config(num_cpus=3)))
  estimator = tf.estimator.Estimator(
      emg.multi_gpu(devices=harness.cpu_devices(num_towers))(
          canned.model_fn), config=canned.config)
  many = run(estimator, kind)
  assert_close(many["variables"], one["variables"], "variable")
  assert one["variables"]["global_step"] == 3
  assert_close(many["metrics"], one["metrics"], "metric")
  assert len(many["predictions"]) == len(one["predictions"]) == 11
  for index, (got, want) in enumerate(zip(many["predictions"],
                                          one["predictions"])):
    assert_close(got, want, f"prediction {index}")
