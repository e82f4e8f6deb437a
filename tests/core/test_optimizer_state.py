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


# Variables made in other ways: partitioned, through a custom getter, in an
# AUTO_REUSE scope. The model: pred = x @ w + Σⱼ emb[idsⱼ], trained with
# Momentum (a slot per variable, per part).
IDS = np.random.RandomState(6).randint(0, 6, size=(7, 2)).astype(np.int64)
Y = np.random.RandomState(7).randn(7, 1).astype(np.float32)
E0 = np.arange(12, dtype=np.float32).reshape(6, 2)[:, :1] / 10.0


def _partitioned(partitioner):
  def make():
    emb = tf1.get_variable("emb", [6, 1], partitioner=partitioner,
                           initializer=tf1.random_uniform_initializer(
                               -1.0, 1.0, seed=3))
    return emb, lambda ids: tf.nn.embedding_lookup(emb, ids)
  return make


def _plain():
  emb = tf1.get_variable("emb", initializer=E0)
  return emb, lambda ids: tf.gather(emb, ids)


def _scaled_getter(getter, *args, **kwargs):
  return getter(*args, **kwargs) * 1.5  # a weight-norm style transform.


def _renaming_getter(getter, name, *args, **kwargs):
  return getter(name + "_v", *args, **kwargs)


def _identity_getter(getter, *args, **kwargs):
  return getter(*args, **kwargs)


def _with_getter(getter):
  def make():
    with tf1.variable_scope("g", custom_getter=getter):
      return _plain()
  return make


def _auto_reuse_scope():
  """A siamese lookup: the scope is entered twice with AUTO_REUSE."""
  for _ in range(2):
    with tf1.variable_scope("siamese", reuse=tf1.AUTO_REUSE):
      emb, lookup = _plain()
  return emb, lookup


def _auto_reuse_get_variable():
  with tf1.variable_scope(tf1.get_variable_scope(), reuse=tf1.AUTO_REUSE):
    emb, lookup = _plain()
    _plain()  # asked again: the same variable.
  return emb, lookup


VARIABLE_MAKERS = {
    "fixed_size_partitioner": _partitioned(tf1.fixed_size_partitioner(2)),
    "min_max_partitioner": _partitioned(tf1.min_max_variable_partitioner(
        max_partitions=3, min_slice_size=8)),
    "axis_size_partitioner": _partitioned(
        tf1.variable_axis_size_partitioner(max_shard_bytes=8)),
    "scaling_custom_getter": _with_getter(_scaled_getter),
    "renaming_custom_getter": _with_getter(_renaming_getter),
    "identity_custom_getter": _with_getter(_identity_getter),
    "auto_reuse_scope": _auto_reuse_scope,
    "auto_reuse_get_variable": _auto_reuse_get_variable,
}


def lookup_model_fn(make_variables, dense_layer="get_variable"):
  def model_fn(features, labels, mode):
    _, lookup = make_variables()
    if dense_layer == "auto_reuse_layers":
      for _ in range(2):
        pred = tf1.layers.dense(features["x"], 1, name="d",
                                reuse=tf1.AUTO_REUSE,
                                kernel_initializer=tf1.constant_initializer(
                                    W0[:, None]))
    else:
      w = tf1.get_variable("w", initializer=W0[:, None])
      pred = tf.matmul(features["x"], w)
    pred += tf.reduce_sum(lookup(features["ids"]), axis=1)
    loss = tf.reduce_mean(tf.square(pred - labels))
    opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.1, 0.9))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
        loss, tf1.train.get_global_step()))
  return model_fn


LOOKUP_FEATURES = {"x": X, "ids": IDS}
ROWS = [(kind, "get_variable") for kind in VARIABLE_MAKERS] + [
    ("auto_reuse_scope", "auto_reuse_layers")]


@pytest.mark.parametrize("kind,dense", ROWS)
@pytest.mark.parametrize("num_towers,variable_update", [
    (2, "replicated"), (3, "replicated"), (3, "shared")])
def test_variables_made_any_way(kind, dense, num_towers, variable_update,
                                session_config):
  model_fn = lookup_model_fn(VARIABLE_MAKERS[kind], dense)
  want, _ = harness.train(model_fn, LOOKUP_FEATURES, Y, 3, session_config)
  got, _ = harness.train(model_fn, LOOKUP_FEATURES, Y, 3, session_config,
                         num_towers=num_towers,
                         variable_update=variable_update)
  harness.assert_same_variables(got, want)


def linear_lookup_model_fn(make_variables):
  """loss = mean(x @ w + Σⱼ emb[idsⱼ]): gradients that do not depend on the
  weights (async towers read them while the previous tower writes)."""
  def model_fn(features, labels, mode):
    del labels
    _, lookup = make_variables()
    w = tf1.get_variable("w", initializer=W0[:, None])
    pred = tf.matmul(features["x"], w) + tf.reduce_sum(
        lookup(features["ids"]), axis=1)
    loss = tf.reduce_mean(pred)
    opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.1, 0.9))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
        loss, tf1.train.get_global_step()))
  return model_fn


def numpy_async_momentum(shards, steps, emb_scale=None):
  """w, and how far the table moved, after `steps` steps of each shard's
  mean gradient applied in turn with Momentum(0.1, 0.9): sparse for the
  table (rows not looked up keep their accumulator) unless a getter scales
  it. The table's start is the run's own: only its change is compared."""
  w, emb = W0[:, None].astype(np.float64), np.zeros((6, 1))
  accumulators = [np.zeros_like(w), np.zeros_like(emb)]
  bounds = np.cumsum([0] + shards)
  for _ in range(steps):
    for a, b in zip(bounds[:-1], bounds[1:]):
      counts = np.bincount(IDS[a:b].ravel(), minlength=6)[:, None]
      grads = [X[a:b].mean(0)[:, None], (emb_scale or 1.0) * counts / (b - a)]
      # Sparse: the rows looked up; dense through a scaling getter.
      rows = [slice(None), slice(None) if emb_scale else counts[:, 0] > 0]
      for k, (var, grad) in enumerate(zip([w, emb], grads)):
        accumulators[k][rows[k]] = 0.9 * accumulators[k][rows[k]] + grad[
            rows[k]]
        var[rows[k]] -= 0.1 * accumulators[k][rows[k]]
  return w, emb


ASYNC_ROWS = ["fixed_size_partitioner", "min_max_partitioner",
              "scaling_custom_getter", "auto_reuse_scope"]


@pytest.mark.parametrize("kind", ASYNC_ROWS)
@pytest.mark.parametrize("num_towers", [2, 3])
def test_async_variables_made_any_way(kind, num_towers, session_config):
  model_fn = linear_lookup_model_fn(VARIABLE_MAKERS[kind])
  start, _ = harness.train(model_fn, LOOKUP_FEATURES, None, 0, session_config)
  got, _ = harness.train(model_fn, LOOKUP_FEATURES, None, 3, session_config,
                         num_towers=num_towers, synchronization="async")
  assert sorted(got) == sorted(start) or kind.endswith("partitioner")
  w, emb = numpy_async_momentum(SHARDS[num_towers], 3,
                                1.5 if "scaling" in kind else None)
  np.testing.assert_allclose(got["w"], w, atol=1e-5)
  table = [name for name in sorted(got) if name.split("/")[-1].startswith(
      ("emb", "part_")) and "Momentum" not in name]
  moved = np.concatenate([got[name] - start[name] for name in table])
  np.testing.assert_allclose(moved, emb, atol=1e-5)


class CountingSGD(tf1.train.GradientDescentOptimizer):
  """Counts its applies in a variable made outside the apply: in the
  model_fn (`counter`), or `global_step` itself."""

  def __init__(self, counter):
    super().__init__(LR)
    self.counter = counter

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    update = super().apply_gradients(grads_and_vars, None, name)
    with tf.control_dependencies([update]):
      return self.counter.assign_add(tf.ones_like(self.counter)).op


def counting_model_fn(counter_of):
  def model_fn(features, labels, mode):
    del labels
    w = tf1.get_variable("w", initializer=W0)
    loss = tf.reduce_mean(tf.tensordot(features, w, 1))
    opt = emg.TowerOptimizer(CountingSGD(counter_of()))
    return tf.estimator.EstimatorSpec(mode, loss=loss,
                                      train_op=opt.minimize(loss))
  return model_fn


COUNTERS = {
    "get_variable": lambda: tf1.get_variable(
        "applies", initializer=0.0, trainable=False),
    "tf_variable": lambda: tf.Variable(0, name="applies", trainable=False),
    "global_step": lambda: tf1.train.get_global_step(),
}


@pytest.mark.parametrize("counter", sorted(COUNTERS))
@pytest.mark.parametrize("num_towers", [2, 3])
def test_replicated_refuses_state_made_outside_the_apply(
    counter, num_towers, session_config):
  with pytest.raises(ValueError, match="CountingSGD's apply_gradients "
                     "writes `(applies|global_step)`.*variable_update="
                     "'shared'"):
    harness.train(counting_model_fn(COUNTERS[counter]), X, None, 1,
                  session_config, num_towers=num_towers,
                  variable_update="replicated")
