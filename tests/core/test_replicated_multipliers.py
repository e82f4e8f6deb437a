"""Replicated variables with gradient multipliers and filtered var_lists (#30).

Tower i differentiates its own copies, but `TowerOptimizer.compute_gradients`
pairs the gradients with tower 0's variables (single-device names), so
multipliers keyed by variable (tf-slim `multiply_gradients` with tower 0's
variables, or with the variables of `grads_and_vars` filtered by a regex on
`var.op.name`: Object Detection's `multiply_gradients_matching_regex`) or
chosen by a regex on the name, and a `var_list` filtered by op name in
Python, train like one device: 3 towers, batch 7, to 1e-5 against the
unwrapped model_fn in plain TF. A multiplier keyed by the tower's own copy
warns.
"""

import logging
import re

import numpy as np
import pytest
import tensorflow as tf
import tf_slim as slim

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
X, Y = harness.linear_data(7)


def model_fn_with(multiply):
  def model_fn(features, labels, mode):
    w = tf1.get_variable("w", initializer=tf.fill([3, 2], 0.1))
    b = tf1.get_variable("b", initializer=tf.zeros([2]))
    loss = tf.reduce_mean(tf.square(tf.matmul(features, w) + b - labels))
    opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.1, 0.9))
    if multiply == "var_list_by_op_name":
      var_list = [v for v in tf1.trainable_variables()
                  if v.op.name.startswith("w")]
      grads_and_vars = opt.compute_gradients(loss, var_list=var_list)
    else:
      grads_and_vars = MULTIPLY[multiply](opt.compute_gradients(loss), w)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=(
        opt.apply_gradients(grads_and_vars, tf1.train.get_global_step())))
  return model_fn


MULTIPLY = {
    "slim_by_variable": lambda gv, w: slim.learning.multiply_gradients(
        gv, {v: tf.constant(3.0) for v in slim.get_variables("w")}),
    "object_detection_regex": lambda gv, w: slim.learning.multiply_gradients(
        gv, {v: tf.constant(3.0) for _, v in gv if re.match(r"^w$",
                                                            v.op.name)}),
    "regex_on_name": lambda gv, w: [
        (g * 3.0 if re.match(r"^w$", v.op.name) else g, v) for g, v in gv],
}


def test_multiplier_keyed_by_the_towers_copy_warns(caplog, session_config):
  """`{w: m}` with tower i's own `w` (its copy) misses tower 0's variable,
  which `compute_gradients` pairs the gradients with: a WARNING."""
  def own_variable(gv, w):
    return [(g * 3.0 if v in {w: 1} else g, v) for g, v in gv]

  MULTIPLY["own_variable"] = own_variable
  try:
    with caplog.at_level(logging.WARNING, logger="absl"):
      harness.train(model_fn_with("own_variable"), X, Y, 1, session_config,
                    num_towers=2, variable_update="replicated")
  finally:
    del MULTIPLY["own_variable"]
  assert "tower 1 transformed the gradients of w differently" in caplog.text


@pytest.mark.parametrize("multiply", sorted(MULTIPLY) +
                         ["var_list_by_op_name"])
def test_multipliers_and_filters_are_exact(multiply, session_config):
  want, _ = harness.train(model_fn_with(multiply), X, Y, 3, session_config)
  got, _ = harness.train(model_fn_with(multiply), X, Y, 3, session_config,
                         num_towers=3, variable_update="replicated")
  for name in want:
    np.testing.assert_allclose(got[name], want[name], atol=1e-5,
                               err_msg=name)
