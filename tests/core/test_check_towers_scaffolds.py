"""check_towers runs a model_fn whatever Scaffold it returns (issue 40):
an `init_fn` (a backbone warm start), a `saver`, a `ready_op`, a
`local_init_op`; the towers then start from one device's values as usual."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

tf1 = tf.compat.v1
X = np.random.RandomState(5).randn(7, 3).astype(np.float32)
Y = np.random.RandomState(6).randn(7, 2).astype(np.float32)
W_START = np.full((3, 2), 0.25, np.float32)   # what the init_fn loads.


def input_fn():
  return tf.data.Dataset.from_tensors((X, Y)).repeat()


def make_scaffold(kind, w):
  if kind == "init_fn":   # Object Detection: warm start from a backbone.
    return tf1.train.Scaffold(init_fn=lambda scaffold, session: w.load(
        W_START, session))
  if kind == "init_fn_one_arg_lambda":  # reads the scaffold's saver.
    return tf1.train.Scaffold(init_fn=lambda scaffold, session: (
        scaffold.saver.as_saver_def(), w.load(W_START, session)))
  if kind == "saver":
    return tf1.train.Scaffold(saver=tf1.train.Saver(max_to_keep=3))
  if kind == "ready_op":
    return tf1.train.Scaffold(
        ready_op=tf1.report_uninitialized_variables(tf1.global_variables()))
  return tf1.train.Scaffold(local_init_op=tf.group(
      tf1.local_variables_initializer(), tf1.tables_initializer()))


def scaffold_fn(features, labels, mode, params):
  w = tf1.get_variable("w", initializer=tf.zeros([3, 2]))
  loss = tf1.losses.mean_squared_error(labels, tf.matmul(features, w))
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
  return tf.estimator.EstimatorSpec(
      mode, loss=loss, train_op=opt.minimize(loss, tf1.train.get_global_step()),
      scaffold=make_scaffold(params["kind"], w))


@pytest.mark.parametrize("kind", ["init_fn", "init_fn_one_arg_lambda",
                                  "saver", "ready_op", "local_init_op"])
def test_check_towers_runs_every_scaffold(kind):
  report = emg.check_towers(scaffold_fn, input_fn, ["/cpu:0", "/cpu:1"],
                            params={"kind": kind}, modes=())
  assert report.ok, str(report)
  worst = dict(report.worst)
  assert worst["w"] <= 1e-5


def test_the_init_fn_ran_in_both_runs():
  """One gradient step from W_START (not from zeros): the loss the check
  reports is the one of W_START, computed here with numpy."""
  report = emg.check_towers(scaffold_fn, input_fn, ["/cpu:0", "/cpu:1",
                                                    "/cpu:2"],
                            params={"kind": "init_fn"}, modes=())
  expected = np.mean((X @ W_START - Y) ** 2)
  np.testing.assert_allclose(report.loss_one_device, expected, rtol=1e-5)
  np.testing.assert_allclose(report.loss_towers, expected, rtol=1e-5)
