"""tf-slim's optimizers and their settings train exactly on two towers.

`classifier.make_optimizer` builds each optimizer the way tf-slim's
train_image_classifier.py does; wrapped in `TowerOptimizer` on two towers,
two steps must move a linear model as numpy's single-device update rules
(TensorFlow's tf.compat.v1.train kernels, written out below) do.

The model is pred = x @ W + b with loss mean((pred - y)^2) over the batch and
the 2 outputs: dW = 2 / (n * 2) * x^T (pred - y), db = the same sum of the
residuals.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import classifier
import harness

tf1 = tf.compat.v1
W0 = np.array([[0.1, -0.2], [0.3, 0.05], [-0.4, 0.2]], np.float32)
B0 = np.array([0.01, -0.02], np.float32)
LR = 0.05
STEPS = 2

# Non-default settings, so that a setting that does not reach the optimizer
# shows.
CONFIGS = {
    "adam": dict(adam_beta1=0.8, adam_beta2=0.99, opt_epsilon=1e-3),
    "rmsprop": dict(rmsprop_decay=0.8, rmsprop_momentum=0.5, opt_epsilon=0.1),
    "adadelta": dict(adadelta_rho=0.9, opt_epsilon=1e-2),
    "adagrad": dict(adagrad_initial_accumulator_value=0.2),
    "ftrl": dict(ftrl_learning_rate_power=-0.5,
                 ftrl_initial_accumulator_value=0.3, ftrl_l1=0.01,
                 ftrl_l2=0.02),
}


def linear_model_fn(config):
  def model_fn(features, labels, mode, params):
    del params
    w = tf1.get_variable("w", initializer=W0)
    b = tf1.get_variable("b", initializer=B0)
    loss = tf.reduce_mean(tf.square(tf.matmul(features, w) + b - labels))
    optimizer = emg.TowerOptimizer(classifier.make_optimizer(
        config, tf.constant(LR)))
    train_op = optimizer.minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn



def adam(p, g, s, t, c):
  s.setdefault("m", np.zeros_like(p))
  s.setdefault("v", np.zeros_like(p))
  s["m"] = c["adam_beta1"] * s["m"] + (1 - c["adam_beta1"]) * g
  s["v"] = c["adam_beta2"] * s["v"] + (1 - c["adam_beta2"]) * g * g
  rate = LR * np.sqrt(1 - c["adam_beta2"]**t) / (1 - c["adam_beta1"]**t)
  return p - rate * s["m"] / (np.sqrt(s["v"]) + c["opt_epsilon"])


def rmsprop(p, g, s, t, c):
  del t
  s.setdefault("ms", np.ones_like(p))  # TF1 starts the mean square at 1.
  s.setdefault("mom", np.zeros_like(p))
  s["ms"] = c["rmsprop_decay"] * s["ms"] + (1 - c["rmsprop_decay"]) * g * g
  s["mom"] = c["rmsprop_momentum"] * s["mom"] + LR * g / np.sqrt(
      s["ms"] + c["opt_epsilon"])
  return p - s["mom"]


def adadelta(p, g, s, t, c):
  del t
  rho, eps = c["adadelta_rho"], c["opt_epsilon"]
  s.setdefault("acc", np.zeros_like(p))
  s.setdefault("acc_update", np.zeros_like(p))
  s["acc"] = rho * s["acc"] + (1 - rho) * g * g
  update = np.sqrt(s["acc_update"] + eps) / np.sqrt(s["acc"] + eps) * g
  s["acc_update"] = rho * s["acc_update"] + (1 - rho) * update * update
  return p - LR * update


def adagrad(p, g, s, t, c):
  del t
  s.setdefault("acc", np.full_like(p, c["adagrad_initial_accumulator_value"]))
  s["acc"] = s["acc"] + g * g
  return p - LR * g / np.sqrt(s["acc"])


def ftrl(p, g, s, t, c):
  del t
  power = -c["ftrl_learning_rate_power"]
  s.setdefault("acc", np.full_like(p, c["ftrl_initial_accumulator_value"]))
  s.setdefault("linear", np.zeros_like(p))
  new_acc = s["acc"] + g * g
  s["linear"] += g - (new_acc**power - s["acc"]**power) / LR * p
  s["acc"] = new_acc
  quadratic = new_acc**power / LR + 2 * c["ftrl_l2"]
  l1 = c["ftrl_l1"]
  return (np.clip(s["linear"], -l1, l1) - s["linear"]) / quadratic


RULES = {"adam": adam, "rmsprop": rmsprop, "adadelta": adadelta,
         "adagrad": adagrad, "ftrl": ftrl}


def numpy_train(name, x, y):
  params = [W0.astype(np.float64), B0.astype(np.float64)]
  slots = [{}, {}]
  for t in range(1, STEPS + 1):
    grads = harness.linear_gradients(x, y, *params)
    params = [RULES[name](p, g, s, t, CONFIGS[name])
              for p, g, s in zip(params, grads, slots)]
  return params


@pytest.mark.parametrize("variable_update", ["shared", "replicated"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_optimizer_trains_two_towers_like_numpy(name, variable_update,
                                                session_config):
  x, y = harness.linear_data(batch=7)  # shards of 4 and 3 examples.
  config = classifier.ClassifierConfig(optimizer=name, **CONFIGS[name])
  values, _ = harness.train(linear_model_fn(config), x, y, STEPS,
                            session_config, num_towers=2,
                            **harness.VARIABLE_MODES[variable_update])
  w, b = numpy_train(name, x, y)
  np.testing.assert_allclose(values["w"], w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(values["b"], b, rtol=1e-5, atol=1e-6)
  assert values["global_step"] == STEPS


def test_default_epsilon_is_tensorflows_for_adam_and_slims_for_rmsprop():
  def epsilon(optimizer):
    config = classifier.ClassifierConfig(optimizer=optimizer)
    return classifier.optimizer_settings(config)["opt_epsilon"]
  assert (epsilon("adam"), epsilon("adadelta"), epsilon("rmsprop")) == (
      1e-8, 1e-8, 1.0)
  assert classifier.optimizer_settings(
      classifier.ClassifierConfig(optimizer="sgd")) == {}


@pytest.mark.parametrize("field,value,expected", [
    ("adam_beta1", 1.0, r"\[0, 1\)"), ("opt_epsilon", 0.0, "> 0"),
    ("adagrad_initial_accumulator_value", 0.0, "> 0"),
    ("ftrl_learning_rate_power", 0.5, "<= 0"), ("ftrl_l1", -1.0, ">= 0"),
    ("rmsprop_decay", float("nan"), r"\[0, 1\)")])
def test_bad_setting_names_the_field(field, value, expected):
  with pytest.raises(ValueError, match=f"`{field}` is .*expected .*{expected}"):
    classifier.ClassifierConfig(**{field: value})


def test_staircase_holds_the_rate_for_whole_periods():
  config = classifier.ClassifierConfig(
      learning_rate=0.1, learning_rate_decay_type="exponential",
      decay_steps=100, decay_rate=0.5, staircase=True)
  with tf.Graph().as_default(), tf1.Session() as session:
    step = tf1.placeholder(tf.int64, [])
    rate = classifier.learning_rate(config, step)
    # 99 steps: still period 0 (0.1); 100 and 250: periods 1 and 2.
    got = [session.run(rate, {step: s}) for s in (99, 100, 250)]
  np.testing.assert_allclose(got, [0.1, 0.05, 0.025], rtol=1e-6)
  with pytest.raises(ValueError, match="staircase applies only to "
                     "'exponential'"):
    classifier.ClassifierConfig(staircase=True,
                                learning_rate_decay_type="cosine")


def test_ftrl_refuses_a_decaying_rate():
  # `ftrl` above: w = (clip(linear) - linear) / (acc**power / LR + 2 l2),
  # i.e. -linear * LR / sqrt(acc) without l1, l2: the weights scale with
  # the current rate, so a rate decaying to 0 takes the model to 0.
  with pytest.raises(ValueError, match="proportional to the current "
                     "learning rate.*use 'fixed'"):
    classifier.ClassifierConfig(optimizer="ftrl",
                                learning_rate_decay_type="cosine")
