"""Control dependencies around `TowerOptimizer.compute_gradients`.

The common `with tf.control_dependencies(update_ops): opt.minimize(loss)`
puts every gradient op into that scope. The wrapper builds the gradients
outside it (the gradients never needed the update ops) and makes the train
op run the scope's control inputs instead: the same step, without one
control edge per update op on every gradient op.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
ModeKeys = tf.estimator.ModeKeys


def bn_model_fn(features, labels, mode, split_apply=False):
  """Dense -> batch norm -> dense; a counter op in the control scope."""
  hidden = tf1.layers.dense(features, 4, name="hidden")
  normed = tf1.layers.batch_normalization(hidden, training=True, name="bn")
  logits = tf1.layers.dense(normed, 2, name="logits")
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
  counter = tf1.get_variable("counter", [], tf.float32, trainable=False,
                             initializer=tf1.zeros_initializer())
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
  step = tf1.train.get_global_step()
  deps = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS) + [
      counter.assign_add(1.0)]
  with tf.control_dependencies(deps):
    if not split_apply:
      train_op = opt.minimize(loss, step)
    else:
      grads_and_vars = opt.compute_gradients(loss)
  if split_apply:  # applied outside the scope: only the gradients were in.
    train_op = opt.apply_gradients(grads_and_vars, step)
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def build(num_towers, split_apply):
  rng = np.random.RandomState(0)
  features = tf.constant(rng.normal(size=[6, 3]).astype(np.float32))
  labels = tf.constant(rng.randint(0, 2, size=[6]).astype(np.int32))
  config = emg.make_session_config(num_cpus=num_towers)
  tf1.train.get_or_create_global_step()
  fn = emg.multi_gpu(
      lambda features, labels, mode: bn_model_fn(features, labels, mode,
                                                 split_apply),
      devices=harness.cpu_devices(num_towers))
  spec = harness.call(fn, features, labels, ModeKeys.TRAIN, config)
  return spec, config


@pytest.mark.parametrize("split_apply", [False, True])
@pytest.mark.parametrize("num_towers", [1, 2])
def test_the_scopes_ops_run_once_per_step(num_towers, split_apply):
  with tf.Graph().as_default():
    spec, config = build(num_towers, split_apply)
    counter, = [v for v in tf1.global_variables() if v.op.name == "counter"]
    mean, = [v for v in tf1.global_variables()
             if v.op.name == "bn/moving_mean"]
    with tf1.Session(config=config) as session:
      session.run(tf1.global_variables_initializer())
      for _ in range(3):
        session.run(spec.train_op)
      # Tower 0's counter op and its batch-norm update ran on each of the 3
      # steps: 3 increments, and the moving mean moved off its initial 0.
      assert session.run(counter) == 3.0
      assert not np.allclose(session.run(mean), 0.0)


def test_gradient_ops_carry_no_control_edges_from_the_scope():
  with tf.Graph().as_default() as graph:
    build(2, split_apply=False)
    scoped = {op.name for op in graph.get_operations()
              if "AssignMovingAvg" in op.name or "AssignAdd" in op.type}
    gradient_ops = [op for op in graph.get_operations()
                    if op.name.startswith(("gradients", "tower_1/gradients"))]
    edges = sum(1 for op in gradient_ops for dep in op.control_inputs
                if dep.name in scoped)
  assert gradient_ops and scoped
  assert edges == 0
