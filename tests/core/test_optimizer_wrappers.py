"""Optimizers that wrap optimizers, inside or outside `TowerOptimizer` (#52).

Written the way third-party code writes them (neither tf.contrib nor
tensorflow-addons is installed; each class below is its pattern, by hand):

- tf.contrib's `MovingAverageOptimizer`: delegates to the optimizer it
  wraps and never runs `Optimizer.__init__` (no `_name`, `_use_locking`,
  `_slots`), then updates an `ExponentialMovingAverage` after the apply;
- tf.contrib's `MultitaskOptimizerWrapper`: not an `Optimizer` at all, a
  plain object forwarding every attribute to the one it wraps;
- decoupled weight decay, `var.assign_sub(wd * var)` as a control
  dependency of each variable's apply, in both spellings: tf.contrib's
  `MomentumWOptimizer` (a `tf.compat.v1.train.MomentumOptimizer` with
  `DecoupledWeightDecayExtension`) and tensorflow-addons' `SGDW` (a Keras
  legacy `SGD` with its own extension). The decay has no data edge from the
  gradient: with towers it must still run after every tower read the
  variable (contract item 25), so the towers' numbers are the reference's,
  numpy's "decay, then momentum, with the gradient at the step's weights";
- michaelrzhang's Lookahead: slow weights in slots, pulled back in
  `_finish`.

Every run trains the same two-layer tanh net (its gradients depend on the
weights, so an apply that ran before a tower's forward pass would show) on 7
examples: shards 4 + 3 and 3 + 2 + 2.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
legacy = tf.keras.optimizers.legacy
TOWERS = [2, 3]
STEPS = 3
LR, MOMENTUM, WD = 0.2, 0.9, 0.05
_RNG = np.random.RandomState(52)
X = _RNG.randn(7, 3).astype(np.float32)
Y = _RNG.randn(7, 2).astype(np.float32)
INITIAL = {"w1": _RNG.randn(3, 4).astype(np.float32) * 0.7,
           "b1": np.full([4], 0.1, np.float32),
           "w2": _RNG.randn(4, 2).astype(np.float32) * 0.7,
           "b2": np.full([2], -0.1, np.float32)}


# ----------------------------------------------------------- the wrappers
class ContribMovingAverage(tf1.train.Optimizer):
  """tf.contrib.opt.MovingAverageOptimizer (TF 1.15) as written there."""

  def __init__(self, opt, average_decay=0.5):  # pylint: disable=super-init-not-called
    self._optimizer = opt
    self._ema = tf1.train.ExponentialMovingAverage(average_decay)

  def compute_gradients(self, *args, **kwargs):
    return self._optimizer.compute_gradients(*args, **kwargs)

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    train_op = self._optimizer.apply_gradients(grads_and_vars, global_step,
                                               name)
    with tf.control_dependencies([train_op]):
      average = self._ema.apply([v for g, v in grads_and_vars
                                 if g is not None])
    return tf.group(train_op, average, name="train_with_avg")


class ForwardingWrapper:
  """tf.contrib.opt.MultitaskOptimizerWrapper's shape: a plain object."""

  def __init__(self, opt):
    self._opt = opt

  def __getattr__(self, name):
    return getattr(self._opt, name)


class ContribMomentumW(tf1.train.MomentumOptimizer):
  """tf.contrib.opt.MomentumWOptimizer: the decay under each apply's
  control."""

  def _decay(self, var):
    return var.assign_sub(WD * var, self._use_locking)

  def _resource_apply_dense(self, grad, var):
    with tf.control_dependencies([self._decay(var)]):
      return super()._resource_apply_dense(grad, var)


class ContribMomentumWAfterGradient(ContribMomentumW):
  """The reference: the same decay, ordered after the gradient."""

  def _resource_apply_dense(self, grad, var):
    with tf.control_dependencies([grad]):
      decay = self._decay(var)
    with tf.control_dependencies([decay]):
      return tf1.train.MomentumOptimizer._resource_apply_dense(  # pylint: disable=protected-access
          self, grad, var)


class AddonsSGDW(legacy.SGD):
  """tensorflow-addons' SGDW: DecoupledWeightDecayExtension on Keras SGD."""

  def _decay(self, var):
    return var.assign_sub(WD * var, self._use_locking)

  def _resource_apply_dense(self, grad, var, apply_state=None):
    with tf.control_dependencies([self._decay(var)]):
      return super()._resource_apply_dense(grad, var, apply_state)


class AddonsSGDWAfterGradient(AddonsSGDW):

  def _resource_apply_dense(self, grad, var, apply_state=None):
    with tf.control_dependencies([grad]):
      decay = self._decay(var)
    with tf.control_dependencies([decay]):
      return legacy.SGD._resource_apply_dense(  # pylint: disable=protected-access
          self, grad, var, apply_state)


class Lookahead(tf1.train.Optimizer):
  """michaelrzhang/lookahead (TF1): delegates the apply, keeps the slow
  weights in its slots and pulls the fast ones back every 2nd step."""

  def __init__(self, optimizer, alpha=0.5):
    super().__init__(False, "Lookahead")
    self.optimizer, self._alpha = optimizer, alpha

  def _create_slots(self, var_list):
    self.optimizer._create_slots(var_list)  # pylint: disable=protected-access
    self._var_list = var_list
    self._create_non_slot_variable(0, "la_step", min(var_list,
                                                     key=lambda v: v.name))
    for v in var_list:
      self._zeros_slot(v, "slow", self._name)  # as there: zeros.

  def _prepare(self):
    self.optimizer._prepare()  # pylint: disable=protected-access

  def _resource_apply_dense(self, grad, var):
    return self.optimizer._resource_apply_dense(grad, var)  # pylint: disable=protected-access

  def _finish(self, update_ops, name_scope):
    with tf.control_dependencies(update_ops):
      step = self._get_non_slot_variable("la_step", tf1.get_default_graph())

      def pull_back():
        ops = []
        for v in self._var_list:
          slow = self.get_slot(v, "slow")
          new = slow + self._alpha * (v - slow)
          ops += [v.assign(new), slow.assign(new)]
        return tf.group(ops + [step.assign(0)])

      update = tf.cond(step >= 1, pull_back,
                       lambda: tf.group(step.assign_add(1)))
    return tf.group(update, name=name_scope)


# ------------------------------------------------------------- the model
def _net(features):
  variables = {name: tf1.get_variable(name, initializer=value)
               for name, value in INITIAL.items()}
  hidden = tf.tanh(tf.matmul(features, variables["w1"]) + variables["b1"])
  return tf.matmul(hidden, variables["w2"]) + variables["b2"], variables


def model_fn_for(make_optimizer, keras=False, inside=True):
  """A model_fn minimizing the net's squared error with `make_optimizer()`,
  wrapped in TowerOptimizer (`inside`: the TowerOptimizer is the inner one,
  `make_optimizer(TowerOptimizer)` gets it)."""

  def model_fn(features, labels, mode):
    outputs, variables = _net(features)
    loss = tf.reduce_mean(tf.square(outputs - labels))
    global_step = tf1.train.get_global_step()
    if keras:
      opt = emg.TowerOptimizer(make_optimizer())
      update = opt.apply_gradients(zip(
          opt.get_gradients(loss, list(variables.values())),
          variables.values()))
      train_op = tf.group(update, global_step.assign_add(1))
    else:
      opt = (emg.TowerOptimizer(make_optimizer()) if inside else
             make_optimizer(emg.TowerOptimizer))
      train_op = opt.minimize(loss, global_step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  return model_fn


def _assert_exact(model_fn, num_towers, session_config, reference_fn=None,
                  **options):
  """`model_fn` on towers trains like `reference_fn` (default: itself) on
  one device; returns the towers' variables."""
  want, want_loss = harness.train(reference_fn or model_fn, X, Y, STEPS,
                                  session_config)
  got, got_loss = harness.train(model_fn, X, Y, STEPS, session_config,
                                num_towers=num_towers, **options)
  harness.assert_same_variables(got, want)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
  return got


def numpy_momentum_with_decay(steps):
  """Decoupled weight decay, then momentum, with the gradient at the step's
  weights: w <- (1 - wd) w - lr (mu a + g), a <- mu a + g (b's too)."""
  w = {k: v.astype(np.float64) for k, v in INITIAL.items()}
  accumulators = {k: np.zeros_like(v) for k, v in w.items()}
  for _ in range(steps):
    grads = _numpy_gradients(w)
    for k in w:
      accumulators[k] = MOMENTUM * accumulators[k] + grads[k]
      w[k] = (1.0 - WD) * w[k] - LR * accumulators[k]
  return w


def _numpy_gradients(w):
  """d/dw of mean((tanh(x w1 + b1) w2 + b2 - y)²)."""
  hidden = np.tanh(X @ w["w1"] + w["b1"])
  d_out = 2.0 * (hidden @ w["w2"] + w["b2"] - Y) / Y.size
  d_pre = d_out @ w["w2"].T * (1.0 - hidden ** 2)
  return {"w1": X.T @ d_pre, "b1": d_pre.sum(0), "w2": hidden.T @ d_out,
          "b2": d_out.sum(0)}


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("num_towers", TOWERS)
def test_wrapper_that_never_ran_the_base_init_inside(session_config,
                                                     num_towers):
  got = _assert_exact(model_fn_for(lambda: ContribMovingAverage(
      tf1.train.MomentumOptimizer(LR, MOMENTUM))), num_towers, session_config)
  assert "w1/ExponentialMovingAverage" in got and "w1/Momentum" in got


def test_wrapper_that_never_ran_the_base_init_outside(session_config):
  _assert_exact(model_fn_for(lambda wrap: ContribMovingAverage(wrap(
      tf1.train.MomentumOptimizer(LR, MOMENTUM))), inside=False), 3,
                session_config)


def test_a_wrapper_is_the_optimizer_it_wraps_outside_multi_gpu():
  """Without towers, TowerOptimizer(wrapper) is the wrapper: its name and
  its apply (the moving averages appear; nothing asked for `_name`)."""
  inner = tf1.train.MomentumOptimizer(LR, MOMENTUM)
  opt = emg.TowerOptimizer(ContribMovingAverage(inner))
  assert opt.get_name() == "TowerContribMovingAverage"
  with tf.Graph().as_default():
    w = tf1.get_variable("w", initializer=1.0)
    opt.minimize(tf.square(w))
    names = {v.op.name for v in tf1.global_variables()}
  assert names == {"w", "w/Momentum", "w/ExponentialMovingAverage"}


@pytest.mark.parametrize("num_towers", TOWERS)
def test_a_forwarding_object_is_an_optimizer(session_config, num_towers):
  _assert_exact(model_fn_for(lambda: ForwardingWrapper(
      tf1.train.MomentumOptimizer(LR, MOMENTUM))), num_towers, session_config)


def test_what_is_no_optimizer_is_a_clear_error():
  with pytest.raises(TypeError, match="ForwardingWrapper.*apply_gradients"):
    emg.TowerOptimizer(ForwardingWrapper(object()))


@pytest.mark.parametrize("num_towers", TOWERS)
@pytest.mark.parametrize("spelling", ["contrib", "addons"])
def test_decoupled_weight_decay_runs_after_every_tower_read(
    session_config, spelling, num_towers):
  if spelling == "contrib":
    make = lambda cls: lambda: cls(LR, MOMENTUM)  # noqa: E731
    plain, ordered = ContribMomentumW, ContribMomentumWAfterGradient
  else:
    make = lambda cls: lambda: cls(LR, momentum=MOMENTUM)  # noqa: E731
    plain, ordered = AddonsSGDW, AddonsSGDWAfterGradient
  keras = spelling == "addons"
  got = _assert_exact(model_fn_for(make(plain), keras=keras), num_towers,
                      session_config,
                      reference_fn=model_fn_for(make(ordered), keras=keras))
  want = numpy_momentum_with_decay(STEPS)
  for name, value in want.items():
    np.testing.assert_allclose(got[name], value, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("num_towers", TOWERS)
def test_lookahead_slow_weights(session_config, num_towers):
  _assert_exact(model_fn_for(lambda: Lookahead(
      tf1.train.MomentumOptimizer(LR, MOMENTUM))), num_towers, session_config)


def test_the_apply_waits_on_one_barrier(session_config):
  """Every op of the apply without an input from the apply waits on one
  op that waits on the gradients: no gradient has a control edge into the
  apply (an edge per gradient per op is what Grappler pays for)."""
  with tf.Graph().as_default() as graph:
    tf1.train.get_or_create_global_step()
    spec = harness.call(emg.multi_gpu(model_fn_for(lambda: ContribMomentumW(
        LR, MOMENTUM)), devices=harness.cpu_devices(2)), tf.constant(X),
                        tf.constant(Y), tf.estimator.ModeKeys.TRAIN,
                        session_config)
    del spec
    decays = [op for op in graph.get_operations()
              if op.type == "AssignSubVariableOp"]
    assert len(decays) == 4
    barriers = {c for op in graph.get_operations() for c in op.control_inputs
                if c.name.endswith("gradients_ready")}
    assert len(barriers) == 1
    barrier, = barriers
    for decay in decays:  # reads and writes the variable after it.
      assert barrier in _ancestors(decay)
    gradient_ops = set(barrier.control_inputs)
    fan_out = [op for op in graph.get_operations()
               if set(op.control_inputs) & gradient_ops and op is not barrier]
    assert not fan_out, [op.name for op in fan_out][:5]


def _ancestors(op):
  seen, stack = set(), [op]
  while stack:
    current = stack.pop()
    for parent in [t.op for t in current.inputs] + list(
        current.control_inputs):
      if parent not in seen:
        seen.add(parent)
        stack.append(parent)
  return seen


def test_a_subclass_of_a_non_legacy_keras_optimizer_names_the_legacy_one():
  """tensorflow-addons' optimizers derive from Keras ones: refused as Keras,
  not taken for a forwarding object (they have both methods)."""

  class AddonsAdamW(tf.keras.optimizers.Adam):
    pass

  with pytest.raises(TypeError, match=r"non-legacy Keras optimizer .*"
                     r"AddonsAdamW.*tf\.keras\.optimizers\.legacy\.Adam"):
    emg.TowerOptimizer(AddonsAdamW())


REPLICATED_WRAPPERS = {
    "moving_average": lambda: ContribMovingAverage(
        tf1.train.MomentumOptimizer(LR, MOMENTUM)),
    "forwarding": lambda: ForwardingWrapper(
        tf1.train.MomentumOptimizer(LR, MOMENTUM)),
    "lookahead": lambda: Lookahead(tf1.train.MomentumOptimizer(LR, MOMENTUM)),
}


@pytest.mark.parametrize("wrapper", sorted(REPLICATED_WRAPPERS))
def test_wrappers_with_a_copy_per_tower(session_config, wrapper):
  """variable_update="replicated": every tower applies with its own copy of
  the wrapper and of the optimizer inside it (fresh state each)."""
  _assert_exact(model_fn_for(REPLICATED_WRAPPERS[wrapper]), 3, session_config,
                variable_update="replicated")


def test_decoupled_weight_decay_with_a_copy_per_tower(session_config):
  got = _assert_exact(
      model_fn_for(lambda: ContribMomentumW(LR, MOMENTUM)), 2, session_config,
      reference_fn=model_fn_for(lambda: ContribMomentumWAfterGradient(
          LR, MOMENTUM)), variable_update="replicated")
  np.testing.assert_allclose(got["w1"], numpy_momentum_with_decay(STEPS)["w1"],
                             atol=1e-5)


# ------------------------------------- transforms inside compute_gradients
TRUST = 0.01  # LARS' eta.


def _trust_ratio(grad, var):
  """LARS' layer-wise trust ratio eta * ||w|| / ||g||: nonlinear in g."""
  return grad * TRUST * tf.norm(var) / (tf.norm(grad) + 1e-9)


class TrustRatioSubclass(tf1.train.MomentumOptimizer):
  """A LARS written in compute_gradients (the subclass spelling)."""

  def compute_gradients(self, loss, var_list=None, **kwargs):
    return [(None if g is None else _trust_ratio(g, v), v)
            for g, v in super().compute_gradients(loss, var_list, **kwargs)]


class TrustRatioWrapper(ForwardingWrapper):
  """The same in a wrapper's compute_gradients (the wrapper spelling)."""

  def compute_gradients(self, loss, var_list=None, **kwargs):
    return [(None if g is None else _trust_ratio(g, v), v)
            for g, v in self._opt.compute_gradients(loss, var_list, **kwargs)]


class TrustRatioInApply(tf1.train.MomentumOptimizer):
  """LARS as tf.contrib.opt.LARSOptimizer writes it: in the apply, which
  TowerOptimizer runs once on the combined gradient."""

  def _resource_apply_dense(self, grad, var):
    return super()._resource_apply_dense(_trust_ratio(grad, var), var)


class VariableScaleSubclass(tf1.train.MomentumOptimizer):
  """A scale in compute_gradients that depends on the variables only."""

  def compute_gradients(self, loss, var_list=None, **kwargs):
    return [(None if g is None else g * (1.0 + tf.reduce_mean(v)), v)
            for g, v in super().compute_gradients(loss, var_list, **kwargs)]


@pytest.mark.parametrize("num_towers", TOWERS)
@pytest.mark.parametrize("make", [
    lambda: TrustRatioSubclass(LR, MOMENTUM),
    lambda: TrustRatioWrapper(tf1.train.MomentumOptimizer(LR, MOMENTUM))],
                         ids=["subclass", "wrapper"])
def test_a_transform_nonlinear_in_the_gradient_is_a_clear_error(
    session_config, make, num_towers):
  name = type(make()).__name__
  with pytest.raises(ValueError, match=rf"{name}\.compute_gradients.*"
                     r"nonlinear.*_apply_dense"):
    harness.train(model_fn_for(make), X, Y, 1, session_config,
                  num_towers=num_towers)


def test_the_same_transform_on_one_tower_is_the_optimizer_itself(
    session_config):
  make = lambda: TrustRatioSubclass(LR, MOMENTUM)  # noqa: E731
  want, _ = harness.train(model_fn_for(make), X, Y, STEPS, session_config)
  got, _ = harness.train(model_fn_for(make), X, Y, STEPS, session_config,
                         num_towers=1)
  harness.assert_same_variables(got, want)


@pytest.mark.parametrize("num_towers", TOWERS)
@pytest.mark.parametrize("make", [
    lambda: TrustRatioInApply(LR, MOMENTUM),
    lambda: VariableScaleSubclass(LR, MOMENTUM)], ids=["apply", "scale"])
def test_transforms_one_device_makes_too(session_config, make, num_towers):
  _assert_exact(model_fn_for(make), num_towers, session_config)
