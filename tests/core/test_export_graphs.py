"""Every graph Estimator exports is the one-tower graph (#52, contract 8).

A 3-tower Estimator exports SavedModels through every path Estimator has:
`export_saved_model` (serving, and `experimental_mode` TRAIN / EVAL),
`experimental_export_all_saved_models` (train, eval and serve meta graphs
in one SavedModel) and the `LatestExporter` / `BestExporter` of
`train_and_evaluate`. Each meta graph holds no `tower_<i>/` op and no
device (but the `save/` ops Estimator's own sharded Saver pins to
/device:CPU:0), loads in a session with ONE CPU and soft placement off, and runs:
its loss, metrics, predictions and train op give numpy's numbers for the
linear model y = x @ w + b (squared error, plain gradient descent) on the
13 examples fed.

Training fed through placeholders (`tf.compat.v1.train.FeedFnHook`) is not
an export: it gets its towers, and trains like one device.
"""

import os
import re

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
ModeKeys = tf.estimator.ModeKeys
LR = 0.1
_RNG = np.random.RandomState(852)
X = _RNG.randn(13, 3).astype(np.float32)
Y = _RNG.randn(13, 1).astype(np.float32)
W0 = np.array([[0.5], [-0.25], [0.75]], np.float32)
ONE_CPU = tf1.ConfigProto(device_count={"CPU": 1}, allow_soft_placement=False)


def model_fn(features, labels, mode):
  w = tf1.get_variable("w", initializer=W0)
  b = tf1.get_variable("b", initializer=np.zeros([1], np.float32))
  y = tf.matmul(features["x"], w) + b
  if mode == ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions={"y": y})
  loss = tf.reduce_mean(tf.square(y - labels))
  train_op = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(
      LR)).minimize(loss, tf1.train.get_global_step())
  return tf.estimator.EstimatorSpec(
      mode, loss=loss, train_op=train_op, predictions={"y": y},
      eval_metric_ops={"mse": tf1.metrics.mean_squared_error(labels, y)})


def numpy_step(w, b, x=X, y=Y):
  """One gradient-descent step of mean((x w + b - y)²) on the batch."""
  residual = x @ w + b - y
  return (w - LR * 2.0 * x.T @ residual / len(x),
          b - LR * 2.0 * residual.sum(0) / len(x))


def numpy_loss(w, b, x=X, y=Y):
  return float(np.mean(np.square(x @ w + b - y)))


def _input_fn():
  return tf.data.Dataset.from_tensor_slices(({"x": X}, Y)).batch(13).repeat()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A 3-tower Estimator after one step, and its weights (numpy's)."""
  model_dir = str(tmp_path_factory.mktemp("export_graphs"))
  estimator = _estimator(model_dir)
  estimator.train(_input_fn, steps=1)
  w, b = numpy_step(W0, np.zeros([1], np.float32))
  np.testing.assert_allclose(estimator.get_variable_value("w"), w, atol=1e-5)
  return estimator, w, b


def _estimator(model_dir, config=None):
  return tf.estimator.Estimator(
      emg.multi_gpu(model_fn, devices=harness.cpu_devices(3)),
      config=config or tf.estimator.RunConfig(
          model_dir, session_config=emg.make_session_config(4)))


def _supervised_receiver():
  return tf.estimator.experimental.build_raw_supervised_input_receiver_fn(
      {"x": tf.constant(X)}, tf.constant(Y))()


def _serving_receiver():
  x = tf1.placeholder(tf.float32, [None, 3], name="x")
  return tf.estimator.export.ServingInputReceiver({"x": x}, {"x": x})


RECEIVERS = {ModeKeys.TRAIN: _supervised_receiver,
             ModeKeys.EVAL: _supervised_receiver,
             ModeKeys.PREDICT: _serving_receiver}
TAGS = {ModeKeys.TRAIN: ["train"], ModeKeys.EVAL: ["eval"],
        ModeKeys.PREDICT: ["serve"]}


def _load_and_run(path, mode):
  """Loads one meta graph on one CPU; checks it is the one-tower graph and
  returns {output name: value} of its signature on X, Y (metric updates run
  first; with TRAIN, also the variables after running the train op)."""
  with tf.Graph().as_default() as graph, tf1.Session(config=ONE_CPU) as s:
    meta = tf1.saved_model.loader.load(s, TAGS[mode], path)
    assert [n.name for n in meta.graph_def.node
            if re.search(r"tower_\d", n.name)] == []
    # Estimator's Saver(sharded=True) pins its own ops to /device:CPU:0.
    assert {n.device for n in meta.graph_def.node
            if not n.name.startswith("save/")} == {""}
    signature = [v for k, v in meta.signature_def.items()][0]
    feed = {info.name: (Y if key.startswith("label") else X)
            for key, info in signature.inputs.items()}
    outputs = signature.outputs
    s.run([v.name for k, v in outputs.items() if k.endswith("update_op")],
          feed)
    values = s.run({k: v.name for k, v in outputs.items()
                    if not k.endswith("update_op")}, feed)
    if mode == ModeKeys.TRAIN:
      s.run(graph.get_collection(tf1.GraphKeys.TRAIN_OP), feed)
      variables = {v.op.name: v for v in tf1.global_variables()}
      values["w_after"], values["b_after"] = s.run([variables["w"],
                                                    variables["b"]])
  return values


def _assert_numpy(values, mode, w, b):
  if mode == ModeKeys.PREDICT:
    np.testing.assert_allclose(values["y"], X @ w + b, atol=1e-5)
    return
  np.testing.assert_allclose(values["loss"], numpy_loss(w, b), atol=1e-5)
  if mode == ModeKeys.EVAL:
    np.testing.assert_allclose(values["metrics/mse/value"],
                               numpy_loss(w, b), atol=1e-5)
  else:
    w_next, b_next = numpy_step(w, b)
    np.testing.assert_allclose(values["w_after"], w_next, atol=1e-5)
    np.testing.assert_allclose(values["b_after"], b_next, atol=1e-5)


def test_export_all_saved_models_every_meta_graph(trained, tmp_path):
  estimator, w, b = trained
  path = estimator.experimental_export_all_saved_models(str(tmp_path),
                                                        RECEIVERS)
  path = path.decode() if isinstance(path, bytes) else path
  for mode in RECEIVERS:
    _assert_numpy(_load_and_run(path, mode), mode, w, b)


@pytest.mark.parametrize("mode", [ModeKeys.TRAIN, ModeKeys.EVAL,
                                  ModeKeys.PREDICT])
def test_export_saved_model_in_each_mode(trained, tmp_path, mode):
  estimator, w, b = trained
  path = estimator.export_saved_model(str(tmp_path), RECEIVERS[mode],
                                      experimental_mode=mode)
  path = path.decode() if isinstance(path, bytes) else path
  _assert_numpy(_load_and_run(path, mode), mode, w, b)


@pytest.mark.parametrize("exporter", ["latest", "best"])
def test_the_exporters_of_train_and_evaluate(tmp_path, exporter):
  config = tf.estimator.RunConfig(
      str(tmp_path / "model"), session_config=emg.make_session_config(4),
      save_checkpoints_steps=1)
  estimator = _estimator(None, config)
  make = (tf.estimator.LatestExporter if exporter == "latest" else
          tf.estimator.BestExporter)
  tf.estimator.train_and_evaluate(
      estimator, tf.estimator.TrainSpec(_input_fn, max_steps=1),
      tf.estimator.EvalSpec(_input_fn, steps=1, throttle_secs=0,
                            exporters=[make(exporter, _serving_receiver)]))
  base = tmp_path / "model" / "export" / exporter
  path, = [str(base / d) for d in os.listdir(base)]
  w, b = numpy_step(W0, np.zeros([1], np.float32))
  _assert_numpy(_load_and_run(path, ModeKeys.PREDICT), ModeKeys.PREDICT, w, b)


class _GraphSeen(tf1.train.SessionRunHook):
  def begin(self):
    self.names = [op.name for op in tf1.get_default_graph().get_operations()]


@pytest.mark.parametrize("num_towers", [None, 2, 3])
def test_training_fed_through_placeholders_has_its_towers(tmp_path,
                                                          num_towers):
  """Estimator.train with an input_fn of placeholders that a FeedFnHook
  feeds: the TRAIN graph is built with towers (it is no export), and the
  2 steps are numpy's on the whole batch of 13."""
  holders = {}

  def input_fn():
    holders["x"] = tf1.placeholder(tf.float32, [None, 3])
    holders["y"] = tf1.placeholder(tf.float32, [None, 1])
    return {"x": holders["x"]}, holders["y"]

  fn = model_fn if num_towers is None else emg.multi_gpu(
      model_fn, devices=harness.cpu_devices(num_towers))
  estimator = tf.estimator.Estimator(fn, config=tf.estimator.RunConfig(
      str(tmp_path), session_config=emg.make_session_config(4)))
  seen = _GraphSeen()
  estimator.train(input_fn, steps=2, hooks=[seen, tf1.train.FeedFnHook(
      lambda: {holders["x"]: X, holders["y"]: Y})])
  towers = {name.split("/")[0] for name in seen.names
            if re.match(r"tower_\d+/", name)}
  assert towers == {f"tower_{i}" for i in range(1, num_towers or 1)}
  w, b = numpy_step(*numpy_step(W0, np.zeros([1], np.float32)))
  np.testing.assert_allclose(estimator.get_variable_value("w"), w, atol=1e-5)
  np.testing.assert_allclose(estimator.get_variable_value("b"), b, atol=1e-5)
