"""Each optimizer's combined update runs when that optimizer's own op runs.

Issue #30's GAN patterns, written without TF-GAN: a discriminator (Adam) and
a generator (momentum) trained from hooks the way TF-GAN's `GANEstimator`
does (sequential: one hook per op; joint: one hook running both; the
train_op only moves `global_step`), a hand-written "D from a hook, then G in
the train_op", and D/G alternating through `tf.cond(global_step % 2 == 0,
...)`. 2 and 3 towers over an uneven batch of 7 must match one device to
1e-5, `global_step` and Adam's `beta1_power` included. The reference is the
unwrapped model_fn in plain TF; the alternation is also checked by hand.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
BATCH = 7
STEPS = 3
REAL = np.random.RandomState(1).randn(BATCH, 2).astype(np.float32)
NOISE = np.random.RandomState(2).randn(BATCH, 3).astype(np.float32)


class RunOpsHook(tf1.train.SessionRunHook):
  """TF-GAN's `RunTrainOpsHook`: runs `ops` before each step."""

  def __init__(self, ops):
    self._ops = ops

  def before_run(self, run_context):
    run_context.session.run(self._ops)


def gan(features, optimizers):
  """The losses and per-network train ops of a tiny GAN (per-example means)."""
  with tf1.variable_scope("generator"):
    w_g = tf1.get_variable("w", initializer=tf.constant(
        [[0.3, -0.1], [0.2, 0.4], [-0.5, 0.1]]))
    fake = tf.matmul(features["noise"], w_g)
  with tf1.variable_scope("discriminator"):
    w_d = tf1.get_variable("w", initializer=tf.constant([[0.7], [-0.3]]))
    b_d = tf1.get_variable("b", initializer=tf.constant([0.1]))
  real_logits = tf.matmul(features["real"], w_d) + b_d
  fake_logits = tf.matmul(fake, w_d) + b_d
  d_loss = tf.reduce_mean(tf.nn.softplus(-real_logits) +
                          tf.nn.softplus(fake_logits))
  g_loss = tf.reduce_mean(tf.nn.softplus(-fake_logits))
  d_opt, g_opt = optimizers()
  return d_loss, g_loss, (d_opt, [w_d, b_d]), (g_opt, [w_g])


def optimizers(wrap):
  return lambda: (wrap(tf1.train.AdamOptimizer(0.1)),
                  wrap(tf1.train.MomentumOptimizer(0.2, 0.9)))


def make_model_fn(pattern, wrap):
  """model_fn of one pattern: "sequential", "joint", "d_hook", "cond"."""

  def model_fn(features, labels, mode):
    del labels
    step = tf1.train.get_global_step()
    d_loss, g_loss, (d_opt, d_vars), (g_opt, g_vars) = gan(
        features, optimizers(wrap))
    if pattern == "cond":
      train_op = tf.cond(
          tf.equal(step % 2, 0),
          lambda: d_opt.minimize(d_loss, step, var_list=d_vars),
          lambda: g_opt.minimize(g_loss, step, var_list=g_vars))
      return tf.estimator.EstimatorSpec(mode, loss=d_loss + g_loss,
                                        train_op=train_op)
    d_op = d_opt.minimize(d_loss, var_list=d_vars)
    if pattern == "d_hook":
      return tf.estimator.EstimatorSpec(
          mode, loss=d_loss + g_loss,
          train_op=g_opt.minimize(g_loss, step, var_list=g_vars),
          training_hooks=[RunOpsHook(d_op)])
    g_op = g_opt.minimize(g_loss, var_list=g_vars)
    hooks = ([RunOpsHook(g_op), RunOpsHook(d_op)] if pattern == "sequential"
             else [RunOpsHook([g_op, d_op])])
    return tf.estimator.EstimatorSpec(
        mode, loss=d_loss + g_loss, train_op=tf1.assign_add(step, 1),
        training_hooks=hooks)

  return model_fn


def train_with_hooks(model_fn, session_config, num_towers=None, steps=STEPS):
  """Runs the spec's train_op `steps` times with its training hooks."""
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    features = {"real": tf.constant(REAL), "noise": tf.constant(NOISE)}
    fn = model_fn if num_towers is None else emg.multi_gpu(
        model_fn, devices=harness.cpu_devices(num_towers))
    spec = harness.call(fn, features, None, harness.TRAIN, session_config)
    with tf1.train.SingularMonitoredSession(
        hooks=list(spec.training_hooks), config=session_config) as session:
      for _ in range(steps):
        session.run(spec.train_op)
      variables = tf1.global_variables()
      return dict(zip([v.op.name for v in variables],
                      session.raw_session().run(variables)))


@pytest.mark.parametrize("num_towers", [2, 3])
@pytest.mark.parametrize("pattern", ["sequential", "joint", "d_hook", "cond"])
def test_each_optimizer_applies_once_from_its_own_op(pattern, num_towers,
                                                     session_config):
  want = train_with_hooks(make_model_fn(pattern, lambda o: o),
                          session_config)
  got = train_with_hooks(make_model_fn(pattern, emg.TowerOptimizer),
                         session_config, num_towers)
  harness.assert_same_variables(got, want)
  # One device: the train_op moves global_step once per step; D's Adam
  # applies once per step (every other step with tf.cond).
  assert got["global_step"] == STEPS
  d_applies = 2 if pattern == "cond" else STEPS
  np.testing.assert_allclose(got["beta1_power"], 0.9 ** (d_applies + 1),
                             rtol=1e-6)


def _softplus_grad(z):
  return 1.0 / (1.0 + np.exp(-z))


def test_cond_alternation_by_hand(session_config):
  """Step 0 (D, Adam's first step moves each weight by lr · sign(grad)),
  step 1 (G, momentum: w_g -= 0.2 · grad), step 2 (D again)."""
  got = train_with_hooks(make_model_fn("cond", emg.TowerOptimizer),
                         session_config, num_towers=3, steps=2)
  w_g = np.array([[0.3, -0.1], [0.2, 0.4], [-0.5, 0.1]])
  w_d, b_d = np.array([[0.7], [-0.3]]), np.array([0.1])
  fake = NOISE @ w_g
  real_z, fake_z = REAL @ w_d + b_d, fake @ w_d + b_d
  grad_w_d = (-(1 - _softplus_grad(real_z)) * REAL +
              _softplus_grad(fake_z) * fake).mean(0)[:, None]
  grad_b_d = (-(1 - _softplus_grad(real_z)) + _softplus_grad(fake_z)).mean(0)
  w_d, b_d = w_d - 0.1 * np.sign(grad_w_d), b_d - 0.1 * np.sign(grad_b_d)
  fake_z = NOISE @ w_g @ w_d + b_d
  grad_w_g = NOISE.T @ (-(1 - _softplus_grad(fake_z)) @ w_d.T) / BATCH
  np.testing.assert_allclose(got["discriminator/w"], w_d, atol=1e-5)
  np.testing.assert_allclose(got["discriminator/b"], b_d, atol=1e-5)
  np.testing.assert_allclose(got["generator/w"], w_g - 0.2 * grad_w_g,
                             atol=1e-5)
  assert got["global_step"] == 2


def test_loss_computed_inside_the_branch_is_a_clear_error(session_config):
  def model_fn(features, labels, mode):
    del labels
    step = tf1.train.get_global_step()
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
    w = tf1.get_variable("w", initializer=tf.ones([2, 1]))
    loss = lambda: tf.reduce_mean(tf.matmul(features["real"], w))
    train_op = tf.cond(tf.equal(step % 2, 0),
                       lambda: opt.minimize(loss(), step), tf.no_op)
    return tf.estimator.EstimatorSpec(mode, loss=loss(), train_op=train_op)

  with pytest.raises(ValueError, match="compute the losses before the"):
    train_with_hooks(model_fn, session_config, num_towers=2, steps=1)
