"""Canned estimators' own optimizers, combined across towers.

tensorflow-estimator's canned estimators (`DNNClassifier`, `LinearClassifier`,
`DNNLinearCombinedClassifier`, `DNNEstimator`, ... and their v1 classes)
build their optimizers inside their model_fn, from a name ('Adagrad', the
default), an instance or a callable, through `canned.optimizers.
get_optimizer_instance_v2` (TF2 classes: Keras legacy optimizers) or
`get_optimizer_instance` (v1 classes: `tf.compat.v1.train` ones). While
`multi_gpu` builds a TRAIN graph's towers, both functions return the
optimizer wrapped in `TowerOptimizer`, so

    est = tf.estimator.Estimator(emg.multi_gpu(devices=...)(canned.model_fn))

trains on N towers with the canned estimator's optimizers unchanged: the
one exception to "an unwrapped optimizer on several towers is an error".
Only these two functions are patched, so any other unwrapped optimizer is
still that error. Every tower builds its own optimizer object; only tower
0's applies (the update chain applies each call's combined gradients with
the optimizer that recorded tower 0's call), so its slots exist once.

The TF2 classes' Keras optimizers apply once per step, so for their
model_fn `variable_update="auto"` keeps shared variables on GPUs too
(`trains_with_keras`): a copy per tower would apply them once per tower.
"""

from __future__ import annotations

import functools

from estimator_multigpu import compat
from estimator_multigpu.graph import patching
from estimator_multigpu.update import tower_optimizer

_FUNCTIONS = ("get_optimizer_instance", "get_optimizer_instance_v2")
_CANNED = "tensorflow_estimator.python.estimator.canned."


def trains_with_keras(model_fn) -> bool:
  """Whether `model_fn` is a TF2 canned estimator's (`est.model_fn`).

  That function's closure holds the estimator; the TF2 classes
  (`DNNClassifierV2`, ..., `tf.estimator.*`) build Keras optimizers, the v1
  ones (`tf.compat.v1.estimator.*`) `tf.compat.v1.train` ones.
  """
  for cell in getattr(model_fn, "__closure__", None) or ():
    try:
      kind = type(cell.cell_contents)
    except ValueError:  # an empty cell.
      continue
    if kind.__module__.startswith(_CANNED) and kind.__name__.endswith("V2"):
      return True
  return False
_ORIGINALS: dict = {}


def _wrapping(get_optimizer):
  @functools.wraps(get_optimizer)
  def get_tower_optimizer(*args, **kwargs):
    return tower_optimizer.TowerOptimizer(get_optimizer(*args, **kwargs))
  return get_tower_optimizer


def _install() -> None:
  module = compat.internal("canned_optimizers")
  for name in _FUNCTIONS:
    _ORIGINALS[name] = getattr(module, name)
    setattr(module, name, _wrapping(_ORIGINALS[name]))


def _uninstall() -> None:
  module = compat.internal("canned_optimizers")
  for name in _FUNCTIONS:
    setattr(module, name, _ORIGINALS.pop(name))


_PATCH = patching.Patch(_install, _uninstall)


def optimizer_scope(tower):
  """Inside: the canned estimators' optimizers are `TowerOptimizer`s."""
  del tower  # the same for every tower.
  return _PATCH.scope()
