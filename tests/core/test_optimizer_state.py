"""Optimizers that keep state their own way, in every strategy (#41).

BERT's `AdamWeightDecayOptimizer` and ALBERT's LAMB make their moments with
`tf.compat.v1.get_variable(param_name + "/adam_m")`; others open their own
variable scope or factor a slot (Adafactor). Under "replicated" every tower
applies the all-reduced gradient with its own copy of that state; under
"async" one optimizer applies the towers' gradients one after another, in
tower order. References: one device (TF, unwrapped) for "replicated"; numpy
for "async" (each tower's own mean gradient applied in turn).

The model is linear: loss = mean(x @ w + b), so a tower's gradient is the
mean of its shard's rows (dw) and 1 (db) whatever w is: the order in which
a tower reads w and the previous tower writes it does not matter.
"""

import re

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg
import harness

tf1 = tf.compat.v1
X = np.random.RandomState(5).randn(7, 3).astype(np.float32)
W0 = np.array([0.3, -0.2, 0.1], np.float32)
LR, B1, B2, EPS, DECAY = 0.1, 0.9, 0.999, 1e-6, 0.01
SHARDS = {2: [4, 3], 3: [3, 2, 2]}


def _name(variable) -> str:
  return re.match("^(.*):\\d+$", variable.name).group(1)


class BertAdamW(tf1.train.Optimizer):
  """google-research/bert's optimizer: moments via get_variable."""

  scope = None  # ALBERT-style spelling: its own variable scope.

  def __init__(self):
    super().__init__(False, "AdamWeightDecay")

  def _moment(self, name, param):
    return tf1.get_variable(name, param.shape.as_list(), tf.float32,
                            trainable=False,
                            initializer=tf1.zeros_initializer())

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    del global_step  # BERT's optimizer leaves it alone.
    ops = []
    for grad, param in grads_and_vars:
      with tf1.variable_scope(self.scope or tf1.get_variable_scope()):
        m = self._moment(_name(param) + "/adam_m", param)
        v = self._moment(_name(param) + "/adam_v", param)
      next_m = B1 * m + (1.0 - B1) * grad
      next_v = B2 * v + (1.0 - B2) * tf.square(grad)
      update = next_m / (tf.sqrt(next_v) + EPS)
      if "bias" not in _name(param):
        update += DECAY * param
      ops += [param.assign(param - LR * update), m.assign(next_m),
              v.assign(next_v)]
    return tf.group(*ops, name=name)


class LambScoped(BertAdamW):
  """ALBERT's LAMB spelling: the moments under the optimizer's own scope."""
  scope = "lamb"


class FactoredSlots(tf1.train.Optimizer):
  """Adafactor-style: a slot of another shape than its variable, made with
  `_create_slots`; the update follows AdamW's without bias correction."""

  def __init__(self):
    super().__init__(False, "Factored")

  def _create_slots(self, var_list):
    for v in var_list:
      self._get_or_make_slot_with_initializer(
          v, tf1.zeros_initializer(), tf.TensorShape([]), tf.float32, "vr",
          self._name)
      self._zeros_slot(v, "m", self._name)

  def _apply_dense(self, grad, var):
    return self._resource_apply_dense(grad, var)

  def _resource_apply_dense(self, grad, var):
    m, vr = self.get_slot(var, "m"), self.get_slot(var, "vr")
    next_m = B1 * m + (1.0 - B1) * grad
    next_v = B2 * vr + (1.0 - B2) * tf.reduce_mean(tf.square(grad))
    update = next_m / (tf.sqrt(next_v) + EPS)
    return tf.group(var.assign_sub(LR * update), m.assign(next_m),
                    vr.assign(next_v))


OPTIMIZERS = {"bert_adamw": BertAdamW, "lamb_scoped": LambScoped,
              "factored": FactoredSlots}


def model_fn_for(optimizer):
  def model_fn(features, labels, mode):
    del labels
    w = tf1.get_variable("w", initializer=W0)
    bias = tf1.get_variable("bias", initializer=0.5)
    loss = tf.reduce_mean(tf.tensordot(features, w, 1) + bias)
    opt = emg.TowerOptimizer(optimizer())
    step = tf1.train.get_global_step()
    train_op = tf.group(opt.minimize(loss, step), step.assign_add(1))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn


def numpy_apply(kind, params, state, grads):
  """One apply of `kind` in numpy (float64)."""
  for name, grad in grads.items():
    m, v = state.setdefault(name, [0.0, 0.0])
    m = B1 * m + (1 - B1) * grad
    v = B2 * v + (1 - B2) * (np.mean(np.square(grad)) if kind == "factored"
                             else np.square(grad))
    update = m / (np.sqrt(v) + EPS)
    if kind != "factored" and name != "bias":
      update = update + DECAY * params[name]
    params[name] = params[name] - LR * update
    state[name] = [m, v]


def numpy_run(kind, shards, steps):
  """Each step, each shard's mean gradient applied in turn (one shard: one
  device)."""
  params = {"w": W0.astype(np.float64), "bias": np.float64(0.5)}
  state = {}
  bounds = np.cumsum([0] + shards)
  for _ in range(steps):
    for a, b in zip(bounds[:-1], bounds[1:]):
      numpy_apply(kind, params, state,
                  {"w": X[a:b].mean(0), "bias": np.float64(1.0)})
  return params


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("num_towers", [2, 3])
def test_replicated_is_one_device(kind, num_towers, session_config):
  model_fn = model_fn_for(OPTIMIZERS[kind])
  want, _ = harness.train(model_fn, X, None, 3, session_config)
  got, _ = harness.train(model_fn, X, None, 3, session_config,
                         num_towers=num_towers, variable_update="replicated")
  harness.assert_same_variables(got, want)
  reference = numpy_run(kind, [7], 3)
  np.testing.assert_allclose(got["w"], reference["w"], atol=1e-5)
  assert got["global_step"] == want["global_step"]


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("num_towers", [2, 3])
def test_async_applies_the_towers_in_order(kind, num_towers, session_config):
  got, _ = harness.train(model_fn_for(OPTIMIZERS[kind]), X, None, 3,
                         session_config, num_towers=num_towers,
                         synchronization="async")
  reference = numpy_run(kind, SHARDS[num_towers], 3)
  for name in ("w", "bias"):
    np.testing.assert_allclose(got[name], reference[name], atol=1e-5)
  one_device, _ = harness.train(model_fn_for(OPTIMIZERS[kind]), X, None, 3,
                                session_config)
  assert sorted(got) == sorted(one_device)  # one set of state, its names.
  assert got["global_step"] == one_device["global_step"]
