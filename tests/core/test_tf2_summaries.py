"""TF2 summaries read the global batch, in a model_fn and in a host_call.

A `host_call` as tensorflow/tpu's resnet_main.py writes it: the model_fn
converts its `TPUEstimatorSpec` itself (`as_estimator_spec()`), and the
host_call opens a `tf.summary.create_file_writer`, `as_default()` and
`record_if(True)`, then writes the loss and a batch accuracy passed as [1]
tensors (read back with `[0]`) and the per-example logits. Each spelling of
the write (`tf.summary.write`, `tf.compat.v2.summary.write` with keywords,
and TensorBoard's `tf.compat.v2.summary.scalar` / `histogram` where it is
installed) runs one training step on 2 and 3 towers (uneven shards, and an
empty one), through the spec's own hooks; the event files must hold one
device's values, computed here with numpy.
"""

import glob
import importlib.util
import os

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
TRAIN = tf.estimator.ModeKeys.TRAIN
RNG = np.random.RandomState(51)
X = RNG.randn(7, 2).astype(np.float32)
C = RNG.randint(0, 3, 7).astype(np.int64)
W0 = np.array([[0.5, -1.0, 0.3], [0.2, 0.4, -0.7]], np.float32)
HAVE_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


def _write(tag, value, step):
  return tf.summary.write(tag, value, step=step)


def _compat_write(tag, value, step):
  return tf.compat.v2.summary.write(tag=tag, tensor=value, step=step)


def _scalar(tag, value, step):
  return tf.compat.v2.summary.scalar(tag, value, step=step)


def _histogram(tag, value, step):
  return tf.compat.v2.summary.histogram(tag, value, step=step)


# spelling -> (write of a scalar, write of the per-example logits).
SPELLINGS = {"tf.summary.write": (_write, _write),
             "tf.compat.v2.summary.write": (_compat_write, _compat_write),
             "tensorboard": (_scalar, _histogram)}


def model_fn(features, labels, mode, params, config):
  del config
  scalar, rows = SPELLINGS[params["spelling"]]
  logits = tf.matmul(features["x"], tf1.get_variable("w", initializer=W0))
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
  accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels),
                                    tf.float32))
  step = tf1.train.get_or_create_global_step()
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.0))

  def host_call_fn(gs, loss_1, accuracy_1, logits):
    with tf.summary.create_file_writer(params["logdir"]).as_default():
      with tf.summary.record_if(True):
        scalar("loss", loss_1[0], gs[0])
        scalar("accuracy", accuracy_1[0], gs[0])
        rows("logits", logits, gs[0])
        return tf1.summary.all_v2_summary_ops()
  host_call = (host_call_fn, [tf.reshape(step, [1]), tf.reshape(loss, [1]),
                              tf.reshape(accuracy, [1]), logits])
  return tf1.estimator.tpu.TPUEstimatorSpec(
      mode, loss=loss, train_op=opt.minimize(loss, step),
      host_call=host_call).as_estimator_spec()


def _events(logdir):
  """{tag: [written arrays]} of every event file in `logdir`."""
  out = {}
  for path in glob.glob(os.path.join(logdir, "events.out.tfevents.*")):
    for event in tf1.train.summary_iterator(path):
      for value in event.summary.value:
        out.setdefault(value.tag, []).append(tf.make_ndarray(value.tensor))
  return out


def _train_step(num_towers, spelling, rows, logdir):
  config = emg.make_session_config(num_cpus=4)
  params = {"spelling": spelling, "logdir": logdir}
  with tf.Graph().as_default():
    x = tf1.placeholder(tf.float32, [None, 2])
    c = tf1.placeholder(tf.int64, [None])
    fn = model_fn if num_towers is None else emg.multi_gpu(
        model_fn, devices=harness.cpu_devices(num_towers))
    spec = fn({"x": x}, c, TRAIN, params, harness.config_for(config))
    with tf1.train.SingularMonitoredSession(
        hooks=spec.training_hooks, config=config) as session:
      session.run(spec.train_op, {x: X[rows], c: C[rows]})
  return _events(logdir)


def _skip_without_tensorboard(spelling):
  if spelling == "tensorboard" and not HAVE_TENSORBOARD:
    pytest.skip("tf.summary.scalar and histogram need TensorBoard")


def _assert_logits(written, logits, spelling):
  """`written` is `logits` whole, or (TensorBoard) its histogram."""
  if spelling != "tensorboard":
    np.testing.assert_allclose(written, logits, rtol=1e-5)
    return
  # Buckets: left edge, right edge, count.
  np.testing.assert_allclose(written[:, 2].sum(), logits.size)
  np.testing.assert_allclose(written[0, 0], logits.min(), rtol=1e-5)
  np.testing.assert_allclose(written[-1, 1], logits.max(), rtol=1e-5)


def _one_device(rows):
  """The loss, accuracy and logits of `rows` (numpy)."""
  logits = X[rows] @ W0
  z = logits - logits.max(1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(1, keepdims=True))
  loss = -logp[np.arange(len(z)), C[rows]].mean()
  return loss, np.mean(logits.argmax(1) == C[rows]), logits


@pytest.mark.parametrize("spelling", list(SPELLINGS))
@pytest.mark.parametrize("num_towers,rows", [(2, slice(0, 5)),
                                             (3, slice(0, 7)),
                                             (3, slice(5, 7))])
def test_host_call_summaries_are_one_devices(num_towers, rows, spelling,
                                             tmp_path):
  _skip_without_tensorboard(spelling)
  loss, accuracy, logits = _one_device(rows)
  one = _train_step(None, spelling, rows, str(tmp_path / "one"))
  got = _train_step(num_towers, spelling, rows, str(tmp_path / "towers"))
  for written in (one, got):
    assert sorted(written) == ["accuracy", "logits", "loss"], written
    assert all(len(values) == 1 for values in written.values()), written
    np.testing.assert_allclose(written["loss"][0], loss, rtol=1e-5)
    np.testing.assert_allclose(written["accuracy"][0], accuracy, rtol=1e-5)
    _assert_logits(written["logits"][0], logits, spelling)
  for tag in got:
    np.testing.assert_allclose(got[tag][0], one[tag][0], rtol=1e-5,
                               atol=1e-6, err_msg=tag)


def body_model_fn(features, labels, mode, params):
  """TF2 summaries written in the model_fn itself (a writer made outside)."""
  scalar, rows = SPELLINGS[params["spelling"]]
  logits = tf.matmul(features["x"], tf1.get_variable("w", initializer=W0))
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
  step = tf1.train.get_or_create_global_step()
  scalar("loss", loss, step)
  rows("logits", logits, step)
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.0))
  return tf.estimator.EstimatorSpec(mode, loss=loss,
                                    train_op=opt.minimize(loss, step))


def _written(tag):
  """The tensors the graph's TF2 summary ops write under `tag`."""
  return [op.inputs[2] for op in tf1.get_default_graph().get_operations()
          if op.type == "WriteSummary" and
          tf.get_static_value(op.inputs[3]).item().decode() == tag]


@pytest.mark.parametrize("spelling", list(SPELLINGS))
@pytest.mark.parametrize("num_towers", [2, 3])
def test_model_fn_writes_are_one_devices(num_towers, spelling, tmp_path):
  _skip_without_tensorboard(spelling)
  loss, _, logits = _one_device(slice(0, 5))
  config = emg.make_session_config(num_cpus=4)
  with tf.Graph().as_default():
    fn = emg.multi_gpu(body_model_fn, devices=harness.cpu_devices(num_towers))
    with tf.summary.create_file_writer(str(tmp_path)).as_default(), (
        tf.summary.record_if(True)):
      fn({"x": tf.constant(X[:5])}, tf.constant(C[:5]), TRAIN,
         {"spelling": spelling}, harness.config_for(config))
    written = {tag: _written(tag) for tag in ("loss", "logits")}
    assert all(len(w) == 1 for w in written.values()), written  # not per tower
    with tf1.Session(config=config) as session:
      session.run(tf1.global_variables_initializer())
      got = session.run({tag: w[0] for tag, w in written.items()})
  np.testing.assert_allclose(got["loss"], loss, rtol=1e-5)
  _assert_logits(got["logits"], logits, spelling)
