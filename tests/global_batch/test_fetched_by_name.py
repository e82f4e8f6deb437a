"""A tensor a hook fetches (by name, or as a tensor) whose op the global
batch's rewrite changed reads the global batch's values, as on one device:
per-example values of a statistic of the batch (`x - mean(x)`, a
standardization by hand), a sort along the batch, an in-batch similarity.
11 examples in batches of 5, 4 and 2 (3 towers cut the last 1/1/0); the
expected numbers are numpy's on the same rows."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

from tests import harness

tf1 = tf.compat.v1
RNG = np.random.RandomState(3)
X = RNG.randn(11, 2).astype(np.float32)
Y = RNG.randn(11).astype(np.float32)
BATCHES = [slice(0, 5), slice(5, 9), slice(9, 11)]
W0 = np.array([0.5, -1.0], np.float32)


def expected(rows):
  """numpy: what each fetched tensor holds for one batch."""
  pred = X[rows] @ W0
  centered = pred - pred.mean()
  return {"centered": centered,
          "standardized": centered / np.sqrt(centered.var() + 1.0),
          "sorted": np.sort(pred),
          "similarity_sum": (np.outer(pred, pred)).sum(1)}


class KeepHook(tf1.train.SessionRunHook):
  def __init__(self, fetches):
    self.fetches, self.values = fetches, []

  def before_run(self, run_context):
    graph = run_context.session.graph
    return tf1.train.SessionRunArgs(
        {k: graph.get_tensor_by_name(v) if isinstance(v, str) else v
         for k, v in self.fetches.items()})

  def after_run(self, run_context, run_values):
    self.values.append(run_values.results)


def model_fn(features, labels, mode):
  w = tf1.get_variable("w", initializer=W0)
  pred = tf.reduce_sum(features["x"] * w, 1)
  centered = tf.subtract(pred, tf.reduce_mean(pred), name="centered")
  mean, var = tf.nn.moments(pred, [0])
  standardized = tf.multiply(pred - mean, tf.math.rsqrt(var + 1.0),
                             name="standardized")
  tf.identity(tf.sort(pred), name="sorted")
  similarity = tf.matmul(pred[:, None], pred[None, :])
  similarity_sum = tf.reduce_sum(similarity, 1, name="similarity_sum")
  hook = KeepHook({"centered": "centered:0", "standardized": standardized,
                   "sorted": "sorted:0",
                   "similarity_sum": similarity_sum})
  del centered
  loss = tf.reduce_mean(tf.square(pred - labels))
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.0))
  return tf.estimator.EstimatorSpec(
      mode, loss=loss, train_op=opt.minimize(loss,
                                             tf1.train.get_global_step()),
      training_hooks=[hook])


def _batches():
  dataset = None
  for rows in BATCHES:
    one = tf.data.Dataset.from_tensors((X[rows], Y[rows]))
    dataset = one if dataset is None else dataset.concatenate(one)
  return tf1.data.make_one_shot_iterator(dataset).get_next()


@pytest.mark.parametrize("num_towers", [None, 2, 3])
def test_fetches_of_rewritten_ops_are_the_global_batchs(num_towers,
                                                         session_config):
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    x, y = _batches()
    fn = model_fn if num_towers is None else emg.multi_gpu(
        model_fn, devices=harness.cpu_devices(num_towers))
    spec = harness.call(fn, {"x": x}, y, tf.estimator.ModeKeys.TRAIN,
                        session_config)
    with tf1.train.MonitoredSession(
        tf1.train.ChiefSessionCreator(config=session_config),
        hooks=spec.training_hooks) as session:
      for _ in BATCHES:
        session.run(spec.train_op)
  hook = [h for h in spec.training_hooks if isinstance(h, KeepHook)][0]
  assert len(hook.values) == len(BATCHES)
  for rows, got in zip(BATCHES, hook.values):
    for name, want in expected(rows).items():
      np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6,
                                 err_msg=name)
