"""EVAL metrics, PREDICT outputs and SavedModels equal one device's.

The model is a fixed logistic classifier p = sigmoid(x @ W + b) (its one
training step has learning rate 0, only to write a checkpoint), so every
expected number below is numpy on the same 16 examples, evaluated in batches
of 7, 7 and a final 2.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
RNG = np.random.RandomState(7)
X = RNG.randn(16, 3).astype(np.float32)
W = np.array([[1.0], [-2.0], [0.5]], np.float32)
B = np.array([0.1], np.float32)
LABELS = (RNG.rand(16, 1) < 0.5).astype(np.float32)
BATCHES = [slice(0, 7), slice(7, 14), slice(14, 16)]


def probabilities(x=X, w=W, b=B):
  return 1.0 / (1.0 + np.exp(-(x @ w + b)))


def classifier_model_fn(features, labels, mode):
  w = tf1.get_variable("w", initializer=W)
  b = tf1.get_variable("b", initializer=B)
  logits = tf.matmul(features["x"], w) + b
  p = tf.sigmoid(logits)
  predictions = {"p": p, "logits": logits, "row": features["row"]}
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(
        mode, predictions=predictions,
        export_outputs={"serving_default": tf.estimator.export.PredictOutput(
            {"p": p})})
  loss = tf1.losses.sigmoid_cross_entropy(labels, logits)
  predicted = tf.cast(p > 0.5, tf.float32)
  metrics = {"accuracy": tf1.metrics.accuracy(labels, predicted),
             "auc": tf1.metrics.auc(labels, p),
             "precision": tf1.metrics.precision(labels, predicted),
             "recall": tf1.metrics.recall(labels, predicted),
             "mean_p": tf1.metrics.mean(p),
             "mae": tf1.metrics.mean_absolute_error(labels, p)}
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.0))
  return tf.estimator.EstimatorSpec(
      mode, loss=loss, eval_metric_ops=metrics,
      train_op=opt.minimize(loss, tf1.train.get_global_step()))


def input_fn():
  features = {"x": X, "row": np.arange(16)}
  return tf.data.Dataset.from_tensor_slices((features, LABELS)).batch(7)


def make_estimator(num_towers, model_dir, session_config, model_fn=None,
                   **options):
  model_fn = model_fn or classifier_model_fn
  if num_towers:
    model_fn = emg.multi_gpu(model_fn, devices=harness.cpu_devices(
        num_towers), **options)
  return tf.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(
      str(model_dir), session_config=session_config))


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("classifier")
  make_estimator(None, model_dir, emg.make_session_config(4)).train(
      input_fn, max_steps=1)
  return model_dir


def numpy_metrics():
  p = probabilities()
  predicted = (p > 0.5).astype(np.float32)
  true_positive = np.sum(predicted * LABELS)
  batch_losses = [np.mean(-LABELS[s] * np.log(p[s]) -
                          (1 - LABELS[s]) * np.log(1 - p[s]))
                  for s in BATCHES]
  return {"accuracy": np.mean(predicted == LABELS),
          "precision": true_positive / predicted.sum(),
          "recall": true_positive / LABELS.sum(),
          "mean_p": p.mean(), "mae": np.mean(np.abs(LABELS - p)),
          "loss": np.mean(batch_losses)}  # Estimator: mean of batch losses.


def test_reference_metrics_match_numpy(checkpoint_dir, session_config):
  got = make_estimator(None, checkpoint_dir, session_config).evaluate(input_fn)
  for name, value in numpy_metrics().items():
    np.testing.assert_allclose(got[name], value, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("num_towers", [1, 2, 3, 4])
def test_metrics_over_towers_equal_one_device(num_towers, checkpoint_dir,
                                              session_config):
  # Batches of 7, 7, 2: over 4 towers the last is cut into 1, 1, 0, 0.
  want = make_estimator(None, checkpoint_dir, session_config).evaluate(
      input_fn)
  got = make_estimator(num_towers, checkpoint_dir, session_config).evaluate(
      input_fn)
  assert sorted(got) == sorted(want)
  for name, value in numpy_metrics().items():
    np.testing.assert_allclose(got[name], value, rtol=1e-5, err_msg=name)
  np.testing.assert_allclose(got["auc"], want["auc"], rtol=1e-5)


def predict_all(estimator):
  return list(estimator.predict(input_fn))


def test_predictions_over_3_towers_in_input_order(checkpoint_dir,
                                                  session_config):
  got = predict_all(make_estimator(3, checkpoint_dir, session_config))
  assert [row["row"] for row in got] == list(range(16))
  np.testing.assert_allclose(np.stack([row["p"] for row in got]),
                             probabilities(), rtol=1e-5)


def test_single_tensor_predictions_over_3_towers(checkpoint_dir,
                                                 session_config):
  def tensor_model_fn(features, labels, mode):
    spec = classifier_model_fn(features, labels, mode)
    if mode != tf.estimator.ModeKeys.PREDICT:
      return spec
    return spec._replace(predictions=spec.predictions["p"])

  for num_towers in (None, 3):
    got = np.stack(predict_all(make_estimator(
        num_towers, checkpoint_dir, session_config, tensor_model_fn)))
    np.testing.assert_allclose(got, probabilities(), rtol=1e-5)


def serving_input_fn():
  x = tf1.placeholder(tf.float32, [None, 3], name="x")
  row = tf1.placeholder(tf.int64, [None], name="row")
  return tf.estimator.export.ServingInputReceiver({"x": x, "row": row},
                                                  {"x": x, "row": row})


SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
tf1 = tf.compat.v1
config = tf1.ConfigProto(device_count={"CPU": 1}, allow_soft_placement=False)
with tf.Graph().as_default(), tf1.Session(config=config) as session:
  meta = tf1.saved_model.loader.load(session, ["serve"], sys.argv[1])
  signature = meta.signature_def["serving_default"]
  out = {}
  for n in (1, 5):
    x = np.array(json.loads(sys.argv[2])[:n], np.float32)
    feed = {signature.inputs["x"].name: x,
            signature.inputs["row"].name: np.arange(n)}
    out[n] = session.run(signature.outputs["p"].name, feed).tolist()
  devices = {node.device for node in meta.graph_def.node if not node.name.startswith("save")}
  towers = [node.name for node in meta.graph_def.node if "tower_" in node.name]
print(json.dumps({"out": out, "devices": sorted(devices), "towers": towers}))
"""


@pytest.mark.slow
def test_export_from_4_towers_serves_on_one_cpu(checkpoint_dir,
                                                session_config, tmp_path):
  estimator = make_estimator(4, checkpoint_dir, session_config)
  export_dir = estimator.export_saved_model(str(tmp_path), serving_input_fn)
  result = subprocess.run(
      [sys.executable, "-c", SERVE, export_dir, json.dumps(X[:5].tolist())],
      capture_output=True, text=True, check=True, timeout=120)
  served = json.loads(result.stdout.strip().splitlines()[-1])
  assert served["devices"] == [""] and served["towers"] == []
  np.testing.assert_allclose(served["out"]["1"], probabilities(X[:1]),
                             rtol=1e-5)
  np.testing.assert_allclose(served["out"]["5"], probabilities(X[:5]),
                             rtol=1e-5)


def test_train_and_evaluate_with_the_wrapped_model_fn(tmp_path,
                                                      session_config):
  estimator = make_estimator(2, tmp_path, session_config)
  metrics, _ = tf.estimator.train_and_evaluate(
      estimator, tf.estimator.TrainSpec(input_fn, max_steps=2),
      tf.estimator.EvalSpec(input_fn, steps=None, throttle_secs=0))
  assert metrics["global_step"] == 2
  np.testing.assert_allclose(metrics["accuracy"],
                             numpy_metrics()["accuracy"], rtol=1e-5)


def test_metric_with_non_additive_state_is_an_error(session_config):
  def last_value_metric(features, labels, mode):
    spec = classifier_model_fn(features, labels, mode)
    state = tf1.Variable(0.0, trainable=False, name="last_p",
                         collections=[tf1.GraphKeys.LOCAL_VARIABLES,
                                      tf1.GraphKeys.METRIC_VARIABLES])
    update = state.assign(tf.reduce_mean(features["x"]))
    metrics = dict(spec.eval_metric_ops, last_p=(state.read_value(), update))
    return spec._replace(eval_metric_ops=metrics)

  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    features = {"x": tf.constant(X), "row": tf.range(16)}
    with pytest.raises(ValueError, match="metric state variable `last_p`"):
      harness.call(emg.multi_gpu(last_value_metric, devices=["/cpu:0",
                                                             "/cpu:1"]),
                   features, tf.constant(LABELS), "eval", session_config)
