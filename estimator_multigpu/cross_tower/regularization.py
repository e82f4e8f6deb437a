"""Regularization counted once per global batch, like one device.

A regularization term r depends on the variables only, so every tower that
adds it to its loss adds the same r. The towers' losses are combined as
Σᵢ wᵢ·lossᵢ: with `loss_reduction="mean"` (wᵢ = nᵢ/n, Σᵢ wᵢ = 1) r counts
once, as on one device; with `"sum"` (wᵢ = 1) it would count once per tower,
in the loss and in the gradients. So with "sum", `once_per_batch` makes
every regularization term of towers 1.. zero (r times 0, with a zero
gradient) and tower 0's, which always has examples, counts alone:

- REGULARIZATION_LOSSES as the tower sees it (tower 0's terms, those of its
  own copies with `variable_update="replicated"`), so
  `tf.compat.v1.losses.get_regularization_loss(es)`, `get_total_loss()` and
  the collection read directly all give the tower's term;
- what the tower itself adds to REGULARIZATION_LOSSES
  (`tf.compat.v1.losses.add_loss(decay, REGULARIZATION_LOSSES)`), when read
  with `get_regularization_loss(es)` or `get_total_loss()`;
- the weight regularizers of Keras layers and of `tf.compat.v1.layers`
  (`kernel_regularizer=`, `layer.losses`), whatever the regularizer is.

A weight decay written by hand (`tf.add_n([tf.nn.l2_loss(v) for v in
tf.compat.v1.trainable_variables()])`) and added to the loss directly is
none of these: with "sum", add it with `tf.compat.v1.losses.add_loss(decay,
tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES)` and read it back with
`get_regularization_loss()`.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Optional

import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu.cross_tower import patching

tf1 = tf.compat.v1
_STATE = threading.local()
_KEY = tf1.GraphKeys.REGULARIZATION_LOSSES


def zeroed(term: Optional[tf.Tensor]) -> Optional[tf.Tensor]:
  """`term` inside a tower whose regularization must not count, else
  itself: 0 where it would be r (no NaN from an infinite r)."""
  if term is None or not _zeroing():
    return term
  term = tf.convert_to_tensor(term)
  return tf.math.multiply_no_nan(term, tf.zeros_like(term))


def counted(regularizer: Optional[Callable]) -> Optional[Callable]:
  """`regularizer`, whose terms are `zeroed` in such a tower."""
  if regularizer is None or not _zeroing():
    return regularizer
  return lambda variable: zeroed(regularizer(variable))


def _zeroing() -> bool:
  return _innermost() is not None


def _innermost() -> Optional[tuple]:
  """(graph, the terms the tower saw on entry) of the innermost such
  tower, when it is the default graph's."""
  towers = getattr(_STATE, "towers", [])
  if towers and towers[-1][0] is tf1.get_default_graph():
    return towers[-1]
  return None


@contextlib.contextmanager
def once_per_batch(tower):
  """Inside tower 1.. (`loss_reduction="sum"`): its regularization is 0."""
  if tower.index == 0:
    yield
    return
  graph = tf1.get_default_graph()
  visible = graph.get_collection_ref(_KEY)
  stack = _STATE.__dict__.setdefault("towers", [])
  stack.append((graph, set()))
  try:
    with tf.name_scope("regularization_counted_once"):
      visible[:] = [zeroed(term) for term in visible]
    stack[-1][1].update(term.ref() for term in visible)
    with _PATCH.scope():
      yield
  finally:
    stack.pop()


def _get_regularization_losses(scope=None) -> list:
  """TensorFlow's, with the terms the tower added itself `zeroed`."""
  terms = _ORIGINAL["get_regularization_losses"](scope)
  tower = _innermost()
  if tower is None:
    return terms
  return [term if term.ref() in tower[1] else zeroed(term) for term in terms]


# Keras' Layer classes (graph mode builds `base_layer_v1`'s; the
# `tf.compat.v1.layers` build on `base_layer`'s), each with its own
# `_handle_weight_regularization`.
_LAYERS = ("keras_base_layer", "keras_base_layer_v1")
_ORIGINAL: dict = {}


def _counting(original: Callable) -> Callable:
  """Keras' `_handle_weight_regularization`, with the regularizer's terms
  `zeroed` in such a tower."""
  def handle(layer, name, variable, regularizer):
    return original(layer, name, variable, counted(regularizer))
  return handle


def _install() -> None:
  util = compat.internal("losses_util")
  _ORIGINAL["get_regularization_losses"] = util.get_regularization_losses
  for module in (util, tf1.losses):
    module.get_regularization_losses = _get_regularization_losses
  for key in _LAYERS:
    layer = compat.internal(key).Layer
    _ORIGINAL[key] = vars(layer)["_handle_weight_regularization"]
    layer._handle_weight_regularization = _counting(_ORIGINAL[key])  # pylint: disable=protected-access


def _uninstall() -> None:
  for module in (compat.internal("losses_util"), tf1.losses):
    module.get_regularization_losses = _ORIGINAL["get_regularization_losses"]
  for key in _LAYERS:
    compat.internal(key).Layer._handle_weight_regularization = (  # pylint: disable=protected-access
        _ORIGINAL.pop(key))


_PATCH = patching.Patch(_install, _uninstall)
