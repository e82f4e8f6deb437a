"""`TowerOptimizer` for Keras 2 legacy optimizers (`tf.keras.optimizers.legacy`).

A graph-mode model_fn uses a Keras optimizer through `get_updates(loss,
params)` (TF2 canned estimators' heads), `get_gradients`, `apply_gradients`
or `minimize`, and often sets `optimizer.iterations = global_step` so that
each apply moves the global step. `TowerOptimizer(keras_optimizer)` returns
a `KerasTowerOptimizer`: a `tf.keras.optimizers.legacy.Optimizer`, so
tensorflow-estimator's type checks accept it, that forwards every other
attribute (hyperparameters, `iterations`, slots, config) to the optimizer it
wraps. Inside a tower its gradients are taken and recorded exactly like
`TowerOptimizer`'s (`recording.tower_gradients`, `record`); once per
step the wrapped optimizer's own `apply_gradients` applies the combined
gradients, so its slots, hyperparameter variables and `iterations` are made
once, with the single-device names, and `iterations` moves once per step.

Each Keras apply moves `iterations`, so only strategies that apply once per
step take Keras optimizers (`check_strategy`): variable_update="shared" with
synchronous towers. Non-legacy Keras optimizers (Keras 2's new ones, Keras
3's) have no graph mode: `not_wrappable_message` names the legacy class.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu.graph import towers as towers_lib
from estimator_multigpu.strategies import base
from estimator_multigpu.update import recording

tf1 = tf.compat.v1
Legacy = tf.keras.optimizers.legacy.Optimizer

def is_legacy_keras(optimizer) -> bool:
  """Whether `optimizer` is a Keras 2 legacy (OptimizerV2) optimizer."""
  return isinstance(optimizer, Legacy)


def is_keras(optimizer) -> bool:
  """Whether `optimizer`'s class, or one it derives from, is Keras's (any
  Keras: tensorflow-addons' optimizers derive from Keras ones)."""
  return any(_keras_root(kind) for kind in type(optimizer).__mro__)


def _keras_root(kind: type) -> bool:
  return kind.__module__.split(".")[0] in ("keras", compat.keras_package())


class KerasTowerOptimizer(Legacy):
  """A Keras legacy optimizer whose applies are combined across towers.

  Outside `multi_gpu`, or outside a tower, every call is the wrapped
  optimizer's. In a tower, `get_updates`, `minimize` and `apply_gradients`
  record the tower's gradients weighted by its share of the global batch
  and return a no-op; `get_gradients` takes them of the (mixed-precision
  scaled) loss. In a tower, `minimize` differentiates with `tf.gradients`
  (a `tape` is not needed). Any other attribute is the wrapped optimizer's.
  """

  _OWN = frozenset({
      "_optimizer", "_summarize_gradient_norm", "get_updates",
      "get_gradients", "minimize", "apply_gradients", "apply_combined",
      "wrapped", "_tower_gradients"})

  def __init__(self, optimizer: Legacy, summarize_gradient_norm: bool = False):
    """Wraps `optimizer` (a `KerasTowerOptimizer` is unwrapped first)."""
    if isinstance(optimizer, KerasTowerOptimizer):  # Wrapping twice: once.
      summarize_gradient_norm |= optimizer._summarize_gradient_norm  # pylint: disable=protected-access
      optimizer = optimizer.wrapped
    object.__setattr__(self, "_optimizer", optimizer)
    object.__setattr__(self, "_summarize_gradient_norm",
                       summarize_gradient_norm)

  def __getattribute__(self, name):
    if name in KerasTowerOptimizer._OWN or (
        name.startswith("__") and name.endswith("__")):
      return object.__getattribute__(self, name)
    return getattr(object.__getattribute__(self, "_optimizer"), name)

  def __setattr__(self, name, value):
    optimizer = self.wrapped
    if name == "iterations" and compat.private(optimizer, "_iterations",
                                               None) is value:
      return  # towers 1.. of a canned estimator given one instance.
    setattr(optimizer, name, value)

  @property
  def wrapped(self) -> Legacy:
    """The optimizer this one wraps."""
    return object.__getattribute__(self, "_optimizer")

  def get_gradients(self, loss, params):
    """The wrapped optimizer's `get_gradients`; in a tower, of its loss."""
    tower = towers_lib.current_tower()
    if tower is None:
      return self.wrapped.get_gradients(loss, params)
    params = tf.nest.flatten(params)
    pairs = recording.tower_gradients(tower, loss, lambda scaled: zip(
        self.wrapped.get_gradients(scaled, params), params))
    return [g for g, _ in pairs]

  def get_updates(self, loss, params):
    """`[apply_gradients(get_gradients(loss, params))]`, as Keras does."""
    if towers_lib.current_tower() is None:
      return self.wrapped.get_updates(loss, params)
    params = tf.nest.flatten(params)
    grads = self.get_gradients(loss, params)
    return [self.apply_gradients(list(zip(grads, params)))]

  def minimize(self, loss, var_list, grad_loss=None, name=None, tape=None):
    """The wrapped optimizer's `minimize`; in a tower, recorded."""
    tower = towers_lib.current_tower()
    if tower is None:
      return self.wrapped.minimize(loss, var_list, grad_loss, name, tape)
    loss = loss() if callable(loss) else loss
    var_list = tf.nest.flatten(var_list() if callable(var_list) else var_list)
    grads_and_vars = recording.tower_gradients(
        tower, loss, lambda scaled: self._tower_gradients(
            scaled, var_list, grad_loss))
    return self.apply_gradients(grads_and_vars, name=name)

  def _tower_gradients(self, loss, var_list, grad_loss):
    """Keras's `_compute_gradients` with `tf.gradients` for the tape."""
    with tf.name_scope(compat.private(self.wrapped, "_name") + "/gradients"):
      grads = tf1.gradients(loss, var_list, grad_ys=grad_loss,
                            colocate_gradients_with_ops=True)
    return list(zip(grads, var_list))

  def apply_gradients(self, grads_and_vars, name=None,
                      experimental_aggregate_gradients=True):
    """In a tower: records the gradients, weighted; else applies them."""
    tower = towers_lib.current_tower()
    if tower is None:
      return self.wrapped.apply_gradients(grads_and_vars, name,
                                          experimental_aggregate_gradients)
    return recording.record(self, tower, grads_and_vars, None, name)

  def apply_combined(self, grads_and_vars, global_step=None, name=None,
                     apply_if: Optional[tf.Tensor] = None):
    """Applies gradients that cover the whole global batch, once.

    The wrapped optimizer's apply moves its `iterations` (the global step,
    when a canned estimator set it so); `global_step` is always None here.
    """
    del global_step  # Keras applies move `iterations` themselves.
    grads_and_vars = list(grads_and_vars)
    if self._summarize_gradient_norm:
      tf1.summary.scalar("gradient_global_norm", tf.linalg.global_norm(
          [g for g, _ in grads_and_vars if g is not None]))
    return base.applied_if(apply_if, lambda: self.wrapped.apply_gradients(
        grads_and_vars, name=name))


def check_strategy(towers: list, strategy) -> None:
  """Refuses Keras optimizers where a step would apply them several times.

  Raises:
    ValueError: a tower recorded a Keras optimizer's call and the strategy
      applies per tower ("replicated", "async"): each Keras apply moves
      `iterations` (the global step, in canned estimators).
  """
  keras = [call.optimizer.wrapped for call in towers[0].optimizer_calls
           if isinstance(call.optimizer, KerasTowerOptimizer)]
  applies_once = strategy.waits_for_towers and not strategy.copies_per_tower
  if keras and not applies_once:
    raise ValueError(
        f"The model_fn trains with a Keras optimizer "
        f"({type(keras[0]).__name__}) and the towers apply updates with the "
        f"{strategy.name!r} strategy, which applies once per tower: every "
        "Keras apply moves the optimizer's `iterations` (a canned "
        "estimator's global step), so it would move several times per step. "
        "Pass multi_gpu(..., variable_update='shared') with "
        "synchronization='sync' (the default 'auto' picks 'replicated' on "
        "two or more GPUs), or use a tf.compat.v1.train optimizer in your own "
        "model_fn.")


_LEGACY_NAMES = ("Adadelta", "Adagrad", "Adam", "Adamax", "Ftrl", "Nadam",
                 "RMSprop", "SGD")


def not_wrappable_message(optimizer) -> str:
  """What `TowerOptimizer` takes, and the legacy class to use instead."""
  given = type(optimizer)
  keras = [kind for kind in given.__mro__ if _keras_root(kind)]
  if not keras:
    lacks = [m for m in ("compute_gradients", "apply_gradients")
             if not callable(getattr(optimizer, m, None))]
    return ("`TowerOptimizer` wraps a `tf.compat.v1.train.Optimizer` (e.g. "
            "MomentumOptimizer, or an object forwarding to one) or a "
            "`tf.keras.optimizers.legacy.Optimizer` (e.g. Adagrad); got "
            f"{given.__module__}.{given.__name__}, which has no "
            f"{' and no '.join(f'`{m}`' for m in lacks)}.")
  kind = keras[0]  # the Keras class itself, or the one a subclass extends.
  root, name = kind.__module__.split(".")[0], kind.__name__
  which = ("a Keras 3 optimizer" if root != compat.keras_package() else
           f"tf.keras.optimizers.{name}, a non-legacy Keras optimizer")
  fix = (f"tf.keras.optimizers.legacy.{name}(...) with the same arguments"
         if name in _LEGACY_NAMES else
         f"one of tf.keras.optimizers.legacy.{{{', '.join(_LEGACY_NAMES)}}} "
         f"(there is no legacy {name})")
  return (f"`TowerOptimizer` got {which} ({given.__module__}."
          f"{given.__name__}), which "
          "has no graph mode: Estimator model_fns (and tensorflow-estimator's "
          "canned estimators) train only with tf.compat.v1.train or Keras 2 "
          f"legacy optimizers. Use {fix}, e.g. emg.TowerOptimizer("
          f"tf.keras.optimizers.legacy.{name if name in _LEGACY_NAMES else 'Adam'}"
          "(learning_rate=0.01)).")
