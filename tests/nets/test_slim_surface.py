"""tf-slim on TF 2.15: the moved-names scan and the surface the field uses.

`slim_compat.apply_all()` (run by `multi_gpu` and by `nets/` on import) must
leave no tf-slim module naming a TensorFlow symbol that is not there; the scan
below reads tf-slim's source like the shim's author did. The other tests run
the tf-slim calls model_fns in the wild make, checking numbers by hand or
with numpy where they are cheap to state.
"""

import ast
import importlib.util
import inspect
import types

import numpy as np
import pytest
import tensorflow as tf
import tf_slim as slim

from estimator_multigpu import slim_compat

tf1 = tf.compat.v1

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

X2 = np.random.RandomState(0).randn(6, 4).astype(np.float32)
X4 = np.random.RandomState(1).randn(2, 5, 5, 3).astype(np.float32)


def missing_names(module) -> list:
  """`alias.name` references in `module`'s source that do not resolve.

  Only aliases bound, at module level, to a TensorFlow module (or to a
  `slim_compat` stand-in for one) are checked.
  """
  tree = ast.parse(inspect.getsource(module))
  missing = set()
  for node in ast.walk(tree):
    if not (isinstance(node, ast.Attribute) and
            isinstance(node.value, ast.Name)):
      continue
    target = vars(module).get(node.value.id)
    if not _is_tensorflow_module(target):
      continue
    try:
      found = hasattr(target, node.attr)
    except ImportError:  # a lazy TF module that cannot load.
      found = False
    if not found:
      missing.add(f"{module.__name__}: {node.value.id}.{node.attr}")
  return sorted(missing)


def _is_tensorflow_module(value) -> bool:
  if isinstance(value, types.ModuleType):
    return value.__name__.startswith("tensorflow")
  return type(value).__module__ == slim_compat.__name__


def test_no_tf_slim_module_names_a_missing_tensorflow_symbol():
  slim_compat.apply_all()
  modules = slim_compat.slim_modules()
  assert len(modules) > 40  # the whole package, not a few modules.
  missing = [name for module in modules for name in missing_names(module)]
  assert not missing, missing


def test_the_scan_finds_what_stock_tf_slim_misses():
  # A fresh, unpatched copy of tf_slim/layers/utils.py: it names ops.Tensor
  # and control_flow_ops.cond, which TF 2.15 moved out of those modules.
  spec = importlib.util.spec_from_file_location(
      "stock_slim_layers_utils", slim.layers.utils.__file__)
  stock = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(stock)
  assert missing_names(stock) == [
      "stock_slim_layers_utils: control_flow_ops.cond",
      "stock_slim_layers_utils: ops.Tensor"]
  slim_compat.apply_all()
  assert slim_compat.patch_moved_names() == 0  # applied already: idempotent.


def run(*fetches):
  """Initializes, runs each of `fetches` in turn; returns the last result."""
  with tf1.Session() as session:
    session.run([tf1.global_variables_initializer(),
                 tf1.local_variables_initializer()])
    return [session.run(fetch) for fetch in fetches][-1]


@pytest.mark.parametrize("fused", [None, False, True])
@pytest.mark.parametrize("inputs", [X2, X4], ids=["2d", "4d"])
def test_batch_norm_trains_and_normalizes(inputs, fused):
  if fused and inputs.ndim == 2:
    fused = None  # fused needs 4-D; tf-slim reshapes 2-D only when asked.
  slim_compat.apply_all()
  with tf.Graph().as_default():
    out = slim.batch_norm(tf.constant(inputs), is_training=True, fused=fused,
                          decay=0.9)
    update = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
    got = run([out, update])[0]
  axes = tuple(range(inputs.ndim - 1))
  want = (inputs - inputs.mean(axes)) / np.sqrt(inputs.var(axes) + 0.001)
  np.testing.assert_allclose(got, want, atol=1e-4)


def test_batch_norm_inference_uses_moving_statistics():
  slim_compat.apply_all()
  with tf.Graph().as_default():
    out = slim.batch_norm(tf.constant(X4), is_training=False)
    got = run(out)
  # Fresh moving statistics are mean 0, variance 1: y = x / sqrt(1 + 0.001).
  np.testing.assert_allclose(got, X4 / np.sqrt(1.001), atol=1e-5)


def linear_loss():
  w = tf1.get_variable("w", initializer=np.ones([4, 1], np.float32))
  return w, tf.reduce_mean(tf.square(tf.matmul(tf.constant(X2), w)))


def numpy_grad(w):
  return 2.0 / len(X2) * X2.T @ (X2 @ w)


@pytest.mark.parametrize("kwargs,rate", [
    (dict(optimizer="SGD"), 0.1),
    (dict(optimizer=tf1.train.GradientDescentOptimizer), 0.1),
    # exponential_decay(0.1, step=0, ...) is 0.1 at the first step.
    (dict(optimizer="SGD", learning_rate_decay_fn=lambda lr, step: (
        tf1.train.exponential_decay(lr, step, 10, 0.5))), 0.1),
])
def test_optimize_loss_with_a_learning_rate(kwargs, rate):
  slim_compat.apply_all()
  with tf.Graph().as_default():
    step = tf1.train.get_or_create_global_step()
    w, loss = linear_loss()
    train_op = slim.optimize_loss(loss, step, learning_rate=0.1,
                                  summaries=slim.OPTIMIZER_SUMMARIES,
                                  **kwargs)
    with tf1.Session() as session:
      session.run(tf1.global_variables_initializer())
      session.run(train_op)
      got_w, got_step = session.run([w, step])
  w0 = np.ones([4, 1])
  np.testing.assert_allclose(got_w, w0 - rate * numpy_grad(w0), atol=1e-5)
  assert got_step == 1


def test_optimize_loss_clips_by_global_norm_and_summarizes():
  slim_compat.apply_all()
  with tf.Graph().as_default():
    step = tf1.train.get_or_create_global_step()
    w, loss = linear_loss()
    train_op = slim.optimize_loss(loss, step, learning_rate=0.1,
                                  optimizer="SGD", clip_gradients=0.5,
                                  summaries=slim.OPTIMIZER_SUMMARIES)
    summaries = {s.op.name for s in tf1.get_collection(
        tf1.GraphKeys.SUMMARIES)}
    got_w = run(train_op, w)
  grad = numpy_grad(np.ones([4, 1]))
  assert np.linalg.norm(grad) > 0.5  # the clip is active.
  np.testing.assert_allclose(
      got_w, 1 - 0.1 * grad * 0.5 / np.linalg.norm(grad), atol=1e-5)
  # (tf-slim writes a learning_rate summary only with a decay function.)
  assert {"OptimizeLoss/loss", "OptimizeLoss/global_norm/gradient_norm",
          "OptimizeLoss/global_norm/clipped_gradient_norm"} <= summaries


def test_create_train_op_with_clipping_and_multipliers():
  slim_compat.apply_all()
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    w, loss = linear_loss()
    train_op = slim.learning.create_train_op(
        loss, tf1.train.GradientDescentOptimizer(0.1),
        gradient_multipliers={w: 2.0}, summarize_gradients=True)
    got_w = run(train_op, w)
  w0 = np.ones([4, 1])
  np.testing.assert_allclose(got_w, w0 - 0.1 * 2.0 * numpy_grad(w0),
                             atol=1e-5)


def test_layers_build_and_run():
  slim_compat.apply_all()
  with tf.Graph().as_default():
    images = tf.constant(X4)
    with slim.arg_scope([slim.conv2d, slim.fully_connected],
                        weights_regularizer=slim.l2_regularizer(1e-4),
                        normalizer_fn=slim.batch_norm,
                        normalizer_params={"is_training": True}):
      net = slim.conv2d(images, 4, 3)
      net = slim.separable_conv2d(net, 4, 3, depth_multiplier=1)
      net = slim.conv2d_transpose(net, 2, 3, stride=2)
      net = slim.avg_pool2d(slim.max_pool2d(net, 2), 2, padding="SAME")
      net = slim.layer_norm(slim.dropout(net, 0.5, is_training=True))
      net = slim.stack(slim.flatten(net), slim.fully_connected, [5, 4])
      logits = slim.fully_connected(net, 3, activation_fn=None)
      probabilities = slim.softmax(logits)
      repeated = slim.repeat(images, 2, slim.conv2d, 3, [3, 3])
    got = run([probabilities, repeated, tf1.losses.get_regularization_loss()])
  np.testing.assert_allclose(got[0].sum(axis=1), [1.0, 1.0], rtol=1e-5)
  assert got[1].shape == (2, 5, 5, 3) and got[2] > 0


def test_streaming_metrics():
  slim_compat.apply_all()
  with tf.Graph().as_default():
    scores = tf.constant([0.1, 0.9, 0.6, 0.3])
    labels = tf.constant([0.0, 1.0, 0.0, 1.0])
    metrics = slim.metrics
    values, updates = metrics.aggregate_metric_map({
        "accuracy": metrics.streaming_accuracy(tf.round(scores), labels),
        "mean": metrics.streaming_mean(scores),
        "auc": metrics.streaming_auc(scores, labels),
        "precision": metrics.streaming_precision(tf.round(scores), labels),
        "recall": metrics.streaming_recall(tf.round(scores), labels),
        "mae": metrics.streaming_mean_absolute_error(scores, labels),
        "pearson": metrics.streaming_pearson_correlation(scores, labels),
    })
    with tf1.Session() as session:
      session.run(tf1.local_variables_initializer())
      session.run(updates)
      got = session.run(values)
  # Rounded scores 0, 1, 1, 0 against labels 0, 1, 0, 1: 2 of 4 right; one
  # true positive of 2 predicted (precision 1/2) and of 2 actual (recall 1/2).
  assert got["accuracy"] == pytest.approx(0.5)
  assert got["mean"] == pytest.approx(0.475)
  assert got["precision"] == pytest.approx(0.5)
  assert got["recall"] == pytest.approx(0.5)
  # |0.1| + |0.1| + |0.6| + |0.7| = 1.5 over 4.
  assert got["mae"] == pytest.approx(0.375)
  # Positives score 0.9, 0.3 and negatives 0.1, 0.6: 3 of 4 pairs ordered.
  assert got["auc"] == pytest.approx(0.75, abs=0.01)
  want = np.corrcoef([0.1, 0.9, 0.6, 0.3], [0, 1, 0, 1])[0, 1]
  assert got["pearson"] == pytest.approx(want, abs=1e-5)
