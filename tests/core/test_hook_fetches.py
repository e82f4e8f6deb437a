"""What a hook fetches is the global batch's (issue 40).

A training, evaluation or prediction hook of the model_fn that fetches a
per-example tensor (held as an attribute, a name, in a dict, through
LoggingTensorHook, or chosen only in `before_run`) sees every example of the
global batch in input order, on 2 and 3 towers, as on one device; a scalar
statistic it fetches at run time is combined like the loss. 11 examples in
batches of 5, 4 and 2 (3 towers cut the last one 1/1/0: an empty shard).
Expected numbers are numpy on the same data.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
TRAIN, EVAL, PREDICT = (tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.EVAL,
                        tf.estimator.ModeKeys.PREDICT)
RNG = np.random.RandomState(11)
X = RNG.randn(11, 2).astype(np.float32)
Y = RNG.randn(11).astype(np.float32)
W0 = np.array([0.5, -1.0], np.float32)
BATCHES = [slice(0, 5), slice(5, 9), slice(9, 11)]
PRED = X @ W0                      # the per-example prediction, numpy.
ERR = (PRED - Y) ** 2


class KeepHook(tf1.train.SessionRunHook):
  """Keeps a tensor (or its name, or a dict of them); collects its values."""

  def __init__(self, fetches):
    self.fetches, self.values = fetches, []

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs(self.fetches)

  def after_run(self, run_context, run_values):
    self.values.append(run_values.results)


class RunTimeHook(tf1.train.SessionRunHook):
  """Chooses its fetches in before_run, by name (the graph is final)."""

  def __init__(self, statistics=True):
    self.values, self._statistics = [], statistics

  def before_run(self, run_context):
    graph = run_context.session.graph
    fetches = {"pred": graph.get_tensor_by_name("pred:0")}
    if self._statistics:
      fetches.update(mean_err="mean_err:0",
                     sum_err=graph.get_tensor_by_name("sum_err:0"))
    return tf1.train.SessionRunArgs(fetches)

  def after_run(self, run_context, run_values):
    self.values.append(run_values.results)


def model_fn(features, labels, mode):
  w = tf1.get_variable("w", initializer=W0)
  pred = tf.reduce_sum(features["x"] * w, 1, name="pred")
  hooks = [KeepHook(pred), KeepHook("pred:0"),
           KeepHook({"p": pred, "twice": 2.0 * pred})]
  logged = []
  hooks.append(tf1.train.LoggingTensorHook(
      {"pred": "pred"}, every_n_iter=1,
      formatter=lambda values: logged.append(values["pred"]) or ""))
  hooks[-1].logged = logged
  if mode == PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions={"pred": pred},
                                      prediction_hooks=hooks + [RunTimeHook(False)])
  err = tf.square(pred - labels)
  tf.reduce_mean(err, name="mean_err")
  tf.reduce_sum(err, name="sum_err")
  loss = tf.reduce_mean(err)
  hooks.append(RunTimeHook())
  metrics = {"err": tf1.metrics.mean(err)} if mode == EVAL else None
  return still_spec(mode, loss, hooks, eval_metric_ops=metrics)


def still_spec(mode, loss, hooks, **kwargs):
  """A spec whose train_op leaves the variables as they are (rate 0)."""
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.0))
  return tf.estimator.EstimatorSpec(
      mode, loss=loss, train_op=opt.minimize(loss, tf1.train.get_global_step()),
      training_hooks=hooks if mode == TRAIN else None,
      evaluation_hooks=hooks if mode == EVAL else None, **kwargs)


def batches():
  """(x, y) of the batches, in order, from a Dataset (a placeholder input
  would be an export graph in PREDICT)."""
  dataset = None
  for batch in BATCHES:
    one = tf.data.Dataset.from_tensors((X[batch], Y[batch]))
    dataset = one if dataset is None else dataset.concatenate(one)
  return tf1.data.make_one_shot_iterator(dataset).get_next()


def run_hooks(fn, mode, num_towers, session_config):
  """The hooks of `fn` in `mode`, after one run per batch."""
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    x, y = batches()
    if num_towers:
      fn = emg.multi_gpu(fn, devices=harness.cpu_devices(num_towers))
    spec = harness.call(fn, {"x": x}, None if mode == PREDICT else y, mode,
                        session_config)
    hooks = {TRAIN: spec.training_hooks, EVAL: spec.evaluation_hooks,
             PREDICT: spec.prediction_hooks}[mode]
    fetch = {TRAIN: spec.train_op, PREDICT: spec.predictions,
             EVAL: [u for _, u in (spec.eval_metric_ops or {}).values()]}[mode]
    with tf1.train.MonitoredSession(
        tf1.train.ChiefSessionCreator(config=session_config),
        hooks=hooks) as session:
      for _ in BATCHES:
        session.run(fetch)
    return [h for h in hooks if hasattr(h, "values") or hasattr(h, "logged")]


def check_hooks(hooks):
  keep_tensor, keep_name, keep_dict, logging_hook, run_time = hooks
  for batch, a, b, c, d, e in zip(BATCHES, keep_tensor.values,
                                  keep_name.values, keep_dict.values,
                                  logging_hook.logged, run_time.values):
    for got in (a, b, c["p"], c["twice"] / 2, d, e["pred"]):
      np.testing.assert_allclose(got, PRED[batch], rtol=1e-5)
    if "mean_err" in e:
      np.testing.assert_allclose(e["mean_err"], ERR[batch].mean(), rtol=1e-5)
      np.testing.assert_allclose(e["sum_err"], ERR[batch].sum(), rtol=1e-5)
  assert len(keep_tensor.values) == len(BATCHES)


@pytest.mark.parametrize("mode", [TRAIN, EVAL, PREDICT])
@pytest.mark.parametrize("num_towers", [None, 2, 3])
def test_hooks_fetch_the_global_batch(mode, num_towers, session_config,
                                      caplog):
  check_hooks(run_hooks(model_fn, mode, num_towers, session_config))
  assert "tower 0" not in caplog.text


class OddHook(KeepHook):
  pass


def unpaired_model_fn(features, labels, mode):
  """Tower 0 alone builds an extra per-example tensor (a debugging branch
  keyed on the name scope): no other tower has its counterpart."""
  del labels
  x = features["x"]
  pred = tf.reduce_sum(x * tf1.get_variable("w", initializer=W0), 1)
  hooks = []
  if "tower_" not in tf1.get_default_graph().get_name_scope():
    hooks = [OddHook(tf.identity(tf.abs(pred), name="debug_abs"))]
  return tf.estimator.EstimatorSpec(mode, predictions={"pred": pred},
                                    prediction_hooks=hooks)


def test_an_unpaired_fetch_is_warned_about(session_config, caplog):
  run_hooks(unpaired_model_fn, PREDICT, 2, session_config)
  assert caplog.text.count("OddHook") == 1, caplog.text
  assert "debug_abs" in caplog.text and "tower 0" in caplog.text


def summary_hook_model_fn(features, labels, mode, params):
  """A SummarySaverHook holding its own scalar summary (not in SUMMARIES)."""
  w = tf1.get_variable("w", initializer=W0)
  err = tf.square(tf.reduce_sum(features["x"] * w, 1) - labels)
  loss = tf.reduce_mean(err)
  summary = tf1.summary.scalar("err_sum", tf.reduce_sum(err), collections=[])
  return still_spec(mode, loss, [tf1.train.SummarySaverHook(
      save_steps=1, output_dir=params["dir"], summary_op=summary)])


@pytest.mark.parametrize("num_towers", [None, 3])
def test_summary_saver_hook_writes_the_global_batch(num_towers, session_config,
                                                    tmp_path):
  def fn(features, labels, mode):
    return summary_hook_model_fn(features, labels, mode,
                                 {"dir": str(tmp_path)})
  run_hooks(fn, TRAIN, num_towers, session_config)
  tf1.summary.FileWriterCache.clear()
  written = [v.simple_value for path in tmp_path.glob("events*")
             for event in tf1.train.summary_iterator(str(path))
             for v in event.summary.value if v.tag == "err_sum"]
  np.testing.assert_allclose(written, [ERR[b].sum() for b in BATCHES],
                             rtol=1e-5)


def check_input_fn():
  return tf.data.Dataset.from_tensors((X[:7], Y[:7])).repeat()


def checked_model_fn(features, labels, mode, params):
  """A training hook that keeps a per-example tensor (params['unpaired']:
  one only tower 0 builds) and one that fetches a dict of them."""
  w = tf1.get_variable("w", initializer=W0)
  pred = tf.reduce_sum(features * w, 1)
  loss = tf.reduce_mean(tf.square(pred - labels))
  kept = pred
  if params["unpaired"] and "tower_" not in tf1.get_default_graph(
      ).get_name_scope():
    kept = tf.identity(pred, name="tower0_only")
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
  return tf.estimator.EstimatorSpec(
      mode, loss=loss, train_op=opt.minimize(loss, tf1.train.get_global_step()),
      training_hooks=[OddHook(kept), KeepHook({"err": tf.abs(pred - labels)})])


@pytest.mark.parametrize("unpaired", [False, True])
def test_check_towers_compares_what_hooks_fetch(unpaired):
  report = emg.check_towers(checked_model_fn, check_input_fn,
                            harness.cpu_devices(3), modes=(),
                            params={"unpaired": unpaired})
  worst = dict(report.worst)
  assert {"hook/OddHook.fetches", "hook/KeepHook.err"} <= set(worst)
  assert report.ok is not unpaired, str(report)
  assert worst["hook/KeepHook.err"] <= 1e-5
  if unpaired:  # tower 0's 3 values where one device has 7.
    assert worst["hook/OddHook.fetches"] == np.inf
    assert "a value a training hook fetches differs" in str(report)
