"""Variable sharing: tower 0 creates the variables, towers 1.. get them back.

Tower 0 is built exactly like the unwrapped model_fn, so its variables get the
single-device names. Towers 1.. reuse them: `get_variable` (tf-slim,
`tf.compat.v1.layers`) through `variable_scope(reuse=True)`, which
`towers.tower_scope` enters, and everything that goes straight to the variable
creators (Keras layers, `tf.Variable`, streaming-metric state) through
`VariableSharing`, which hands tower 0's variables back in creation order.
Every mismatch is a `VariableMismatchError` naming the tower and the variable.
"""

from __future__ import annotations

import contextlib
import threading

import tensorflow as tf

from estimator_multigpu import compat

vs_lib = compat.internal("variable_scope")


tf1 = tf.compat.v1


class VariableMismatchError(ValueError):
  """A tower 1.. did not create the variables tower 0 created."""


class VariableSharing:
  """Hands tower 0's variables back when towers 1.. create them again.

  `get_variable` reuse covers tf-slim and `tf.compat.v1.layers`. Keras layers,
  `tf.Variable` and metric state go straight to the variable creators, so
  tower 0 records what it creates that way and towers 1.. get those
  variables back in creation order (shape and dtype checked).
  """

  def __init__(self):
    self._tower0: list = []
    self._store_before: set = set()

  def tower0_scope(self):
    """Records the variables tower 0 creates outside `get_variable`."""
    self._store_before = set(_variable_store_names())

    def record(next_creator, **kwargs):
      variable = next_creator(**kwargs)
      if not getattr(_BUILT_ONCE, "active", False):
        self._tower0.append(variable)
      return variable

    return tf1.variable_creator_scope(record)

  def finish_tower0(self) -> None:
    """Drops what `get_variable` made: reuse covers those."""
    # `get_variable("")` under a scope (slot_creator: the shadow variables
    # of `ExponentialMovingAverage`) is stored as "<scope>/".
    store = {name.rstrip("/") for name in
             set(_variable_store_names()) - self._store_before}
    self._tower0 = [v for v in self._tower0 if v.op.name not in store]

  @contextlib.contextmanager
  def reuse_scope(self, tower, substitute=None):
    """Serves tower `tower`'s creations from tower 0's, in order.

    Args:
      tower: the tower 1.. being built.
      substitute: optional `variable -> variable` applied to what is served
        (the replicated strategy hands out the tower's own copy).
    """
    served = []

    def reuse(next_creator, **kwargs):
      del next_creator
      variable = self._serve(tower, len(served), kwargs, served)
      return substitute(variable) if substitute else variable

    with tf1.variable_creator_scope(reuse):
      yield
    if len(served) != len(self._tower0):
      raise VariableMismatchError(
          f"Tower {tower.index} created {len(served)} variables outside "
          f"`get_variable` but tower 0 created {len(self._tower0)}. The "
          "model_fn must create the same variables in every tower; create "
          "every variable unconditionally.")

  def _serve(self, tower, position: int, kwargs: dict, served: list):
    name = kwargs.get("name") or "<unnamed>"
    if position >= len(self._tower0):
      raise VariableMismatchError(
          f"Tower {tower.index} creates variable `{name}`, which tower 0 did "
          "not create: a variable must be created in every tower (tower 0 "
          "builds it, the others reuse it). Create it unconditionally.")
    variable = self._tower0[position]
    _check_additive(name, kwargs)
    shape = kwargs.get("shape")
    if shape is not None and tf.TensorShape(shape) != variable.shape:
      raise VariableMismatchError(
          f"Tower {tower.index} creates variable `{name}` with shape "
          f"{tf.TensorShape(shape)} where tower 0's matching variable "
          f"`{variable.op.name}` has shape {variable.shape}. The model_fn "
          "must build the same variables, in the same order, in every tower.")
    served.append(variable)
    return variable


_BUILT_ONCE = threading.local()


@contextlib.contextmanager
def built_once():
  """Inside: what tower 0 creates is its alone, towers 1.. build none of it
  (a readout built once from the global batch, `global_calls`)."""
  outer = getattr(_BUILT_ONCE, "active", False)
  _BUILT_ONCE.active = True
  try:
    yield
  finally:
    _BUILT_ONCE.active = outer


_METRIC_COLLECTIONS = (tf1.GraphKeys.METRIC_VARIABLES,
                       tf1.GraphKeys.LOCAL_VARIABLES)


def _check_additive(name: str, kwargs: dict) -> None:
  """Metric state is shared by the towers, which is exact only if additive."""
  collections = kwargs.get("collections") or ()
  if not any(key in collections for key in _METRIC_COLLECTIONS):
    return
  aggregation = kwargs.get("aggregation")
  if aggregation != tf.VariableAggregation.SUM:
    raise ValueError(
        f"The metric state variable `{name}` declares aggregation "
        f"{getattr(aggregation, 'name', aggregation)}. `multi_gpu` computes "
        "a metric over all towers by letting every tower add into one shared "
        "state, which is exact only for additive state (totals, counts): "
        "declare it with aggregation=tf.VariableAggregation.SUM if it is "
        "additive, or compute this metric outside the towers.")


def _variable_store_names() -> list:
  """Names of the variables `get_variable` holds in this graph."""
  store = vs_lib._get_default_variable_store()  # pylint: disable=protected-access
  return list(compat.private(store, "_vars"))


def check_no_new_globals(tower, before: set) -> None:
  """Raises if tower 1.. created global variables (it must reuse tower 0's)."""
  created = [v.op.name for v in tf1.global_variables()
             if v.op.name not in before]
  if created:
    raise VariableMismatchError(
        f"Tower {tower.index} created variables that tower 0 did not: "
        f"{', '.join(created)}. A variable must be created in every tower "
        "(tower 0 builds it, the others reuse it); do not create variables "
        "conditionally or under `reuse=tf.compat.v1.AUTO_REUSE` per tower.")


@contextlib.contextmanager
def reuse_scope_for_get_variable(tower, substitute=None):
  """`get_variable` in tower `tower` returns tower 0's variable of that name.

  With `substitute` (`(variable, regularizer) -> variable`), it returns what
  `substitute` makes of tower 0's variable and the call's regularizer
  instead (the tower's own copy, regularized like tower 0's).

  Anything `get_variable` refuses there (a name tower 0 never created, another
  shape) becomes a `VariableMismatchError` naming the tower and the variable.
  Enter it before the tower's name scope: re-entering a variable scope object
  would otherwise reset the name scope.
  """
  prefix = f"{tower.name}/"

  def tower0_getter(getter, name, *args, **kwargs):
    # Scopes made from a variable's name (slot_creator) carry the tower's.
    name = name[len(prefix):] if name.startswith(prefix) else name
    try:
      variable = getter(name, *args, **kwargs)
    except ValueError as error:
      raise VariableMismatchError(
          f"Tower {tower.index} asked `get_variable` for a variable that "
          f"tower 0 did not create with that name and shape: `{name}` "
          f"(TensorFlow said: {error})") from error
    return (substitute(variable, kwargs.get("regularizer")) if substitute
            else variable)

  with tf1.variable_scope(tf1.get_variable_scope(), reuse=True,
                          custom_getter=tower0_getter):
    yield
