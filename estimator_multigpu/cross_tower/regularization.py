"""Regularization counted once per global batch, like one device.

A weight regularization term r depends on the variables only (not on the
shard: `tensor_kinds.NONE`), so every tower that adds it to its loss adds the
same r. The towers' losses are combined as Σᵢ wᵢ·lossᵢ: with
`loss_reduction="mean"` (wᵢ = nᵢ/n, Σᵢ wᵢ = 1) r counts once, as on one
device; with `"sum"` (wᵢ = 1) it would count once per tower, in the loss and
in the gradients. So inside towers 1.. (`scope_factory`):

- With "sum", every weight term is zero (r times 0, with a zero gradient)
  and tower 0's counts alone: the REGULARIZATION_LOSSES the tower sees
  (`get_regularization_loss(es)`, `get_total_loss()`, the collection read
  directly), what the tower adds there itself (a hand-written decay through
  `tf.compat.v1.losses.add_loss(decay, REGULARIZATION_LOSSES)`, read with
  `get_regularization_loss(es)` or `get_total_loss()`), and the weight
  regularizers of Keras layers and `tf.compat.v1.layers`
  (`kernel_regularizer=`, `layer.losses`) whatever the regularizer.
- With shared variables a tower sees tower 0's weight terms (it reuses the
  variables, so it does not create them again), but not the terms of tower
  0's shard (an activity regularizer: the tower adds its own); a weight term
  the tower adds again itself hides tower 0's (the same op type over the
  same variables) from `get_regularization_loss(es)` and `get_total_loss()`,
  so a hand-written decay counts once per tower, like the rest of its loss.

A weight decay written by hand and added to the loss directly
(`loss + tf.add_n([tf.nn.l2_loss(v) for v in trainable_variables()])`)
is none of these: with "sum" it would count once per tower, so a term of
tower 1's loss computed from the variables only, and from none of the terms
above, is a WARNING (found from the dataflow) naming the fix: add it to
REGULARIZATION_LOSSES and read it back with `get_regularization_loss()`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Callable, Optional

from absl import logging
import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu.graph import dataflow
from estimator_multigpu.graph import patching
from estimator_multigpu.graph import tensor_kinds

tf1 = tf.compat.v1
_STATE = threading.local()
_KEY = tf1.GraphKeys.REGULARIZATION_LOSSES
# The zero terms made here (a loss term built from one is counted once).
ZEROED = "estimator_multigpu_zeroed_regularization"


@dataclasses.dataclass
class _TowerView:
  """What tower 1.. sees of REGULARIZATION_LOSSES."""
  graph: tf.Graph
  zero: bool  # weight terms are zero in this tower ("sum").
  analysis: tensor_kinds.ShardAnalysis  # the tower's own shard.
  seen: list  # (tower 0's term, what the tower sees of it).
  zeroed: set = dataclasses.field(default_factory=set)  # refs made here.


def scope_factory(split, zero_weight_terms: bool) -> Callable:
  """Tower scopes: towers 1.. see regularization as the module doc says."""
  def scope(tower):
    if tower.index == 0:
      return contextlib.nullcontext()
    return _tower_view(tower, zero_weight_terms,
                       tensor_kinds.shard_analysis(split.shards[0]),
                       tensor_kinds.shard_analysis(split.shards[tower.index]))
  return scope


@contextlib.contextmanager
def _tower_view(tower, zero: bool, shard0: tensor_kinds.ShardAnalysis,
                own: tensor_kinds.ShardAnalysis):
  graph = tf1.get_default_graph()
  visible = graph.get_collection_ref(_KEY)
  entry = list(visible)
  weights = [t for t in map(_tensor, entry)
             if shard0.status(t) == tensor_kinds.NONE]
  view = _TowerView(graph, zero, own, [])
  stack = _STATE.__dict__.setdefault("views", [])
  stack.append(view)
  try:
    with tf.name_scope("regularization_counted_once"):
      view.seen = [(t, _zeroed(view, t) if zero else t) for t in weights]
    visible[:] = [shown for _, shown in view.seen]
    with _PATCH.scope():
      yield
    if zero and tower.index == 1:
      _warn_per_tower_terms(getattr(tower.output, "loss", None), own)
  finally:
    stack.pop()
    visible[:] = entry + visible[len(view.seen):]


def _warn_per_tower_terms(loss: Optional[tf.Tensor],
                          analysis: tensor_kinds.ShardAnalysis) -> None:
  """Warns about a term of `loss` computed from the variables only and from
  none of the zero terms: with "sum" it counts once per tower."""
  if loss is None:
    return
  variables = {v.op for v in tf1.global_variables() + tf1.local_variables()}
  zeroed = {t.op for t in tf1.get_collection(ZEROED)}
  for term in _summands(loss):
    ancestors = dataflow.ancestors([term])
    if (analysis.status(term) == tensor_kinds.NONE and ancestors & variables
        and not ancestors & zeroed):
      logging.warning(
          "multi_gpu(loss_reduction='sum'): the loss adds a term computed "
          "from the variables only (%s, a weight decay written by hand?) "
          "that is not in REGULARIZATION_LOSSES, so it counts once per tower "
          "in the loss and the gradients. Add it with tf.compat.v1.losses."
          "add_loss(term, tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES) and "
          "add tf.compat.v1.losses.get_regularization_loss() to the loss: "
          "multi_gpu counts that once.", term.op.type)
      return


def _summands(loss: tf.Tensor) -> list:
  """The terms `loss` adds up (through Add, AddN, Identity)."""
  terms, stack = [], [loss]
  while stack:
    tensor = stack.pop()
    if tensor.op.type in dataflow.SUMS_OF_INPUTS:
      stack.extend(tensor.op.inputs)
    else:
      terms.append(tensor)
  return terms


def _innermost() -> Optional[_TowerView]:
  views = getattr(_STATE, "views", [])
  if views and views[-1].graph is tf1.get_default_graph():
    return views[-1]
  return None


def _tensor(term) -> tf.Tensor:
  """A term as a graph tensor (`get_variable` adds lazily evaluated ones)."""
  return term if hasattr(term, "ref") else tf.convert_to_tensor(term)


def _zeroed(view: _TowerView, term: tf.Tensor) -> tf.Tensor:
  """0 where `term` would be r (no NaN from an infinite r)."""
  term = tf.convert_to_tensor(term)
  if term.ref() in view.zeroed:
    return term
  zero = tf.math.multiply_no_nan(term, tf.zeros_like(term))
  view.zeroed.add(zero.ref())
  tf1.add_to_collection(ZEROED, zero)
  return zero


def counted(regularizer: Optional[Callable]) -> Optional[Callable]:
  """`regularizer`, whose terms are zero in a tower where weight terms are."""
  view = _innermost()
  if regularizer is None or view is None or not view.zero:
    return regularizer

  def zeroing(variable):
    term = regularizer(variable)
    return None if term is None else _zeroed(view, term)
  return zeroing


def _get_regularization_losses(scope=None) -> list:
  """TensorFlow's, as the tower sees it (see the module doc)."""
  terms = _ORIGINAL["get_regularization_losses"](scope)
  view = _innermost()
  if view is None:
    return terms
  terms = [_tensor(t) for t in terms]
  shown = {s.ref() for _, s in view.seen}
  again = [t for t in terms if t.ref() not in shown and
           t.ref() not in view.zeroed and
           view.analysis.status(t) == tensor_kinds.NONE]
  hidden = _counterparts(again, view.seen)
  repeated = {t.ref() for t in again}
  return [_zeroed(view, t) if view.zero and t.ref() in repeated else t
          for t in terms if t.ref() not in hidden]


def _counterparts(terms: list, seen: list) -> set:
  """The refs of what the tower sees of tower 0's terms that `terms`
  repeat: the same op type over the same variables, in order."""
  variables = {v.op for v in tf1.global_variables() + tf1.local_variables()}
  signature = lambda t: (t.op.type, t.dtype, frozenset(  # pylint: disable=g-long-lambda
      dataflow.ancestors([t]) & variables))
  hidden = set()
  for term in terms:
    for original, visible in seen:
      if visible.ref() not in hidden and signature(original) == signature(
          term):
        hidden.add(visible.ref())
        break
  return hidden


def _counting(original: Callable) -> Callable:
  """Keras' `_handle_weight_regularization`, with the regularizer's terms
  zero in a tower where weight terms are."""
  def handle(layer, name, variable, regularizer):
    return original(layer, name, variable, counted(regularizer))
  return handle


# Keras' Layer classes (graph mode builds `base_layer_v1`'s; the
# `tf.compat.v1.layers` build on `base_layer`'s), each with its own
# `_handle_weight_regularization`.
_LAYERS = ("keras_base_layer", "keras_base_layer_v1")
_ORIGINAL: dict = {}


def _install() -> None:
  util = compat.internal("losses_util")
  _ORIGINAL["get_regularization_losses"] = util.get_regularization_losses
  for module in (util, tf1.losses):
    module.get_regularization_losses = _get_regularization_losses
  for key in _LAYERS:
    layer = compat.internal(key).Layer
    _ORIGINAL[key] = compat.private(layer, "_handle_weight_regularization",
                                    own=True)
    compat.set_private(layer, "_handle_weight_regularization",
                       _counting(_ORIGINAL[key]))


def _uninstall() -> None:
  for module in (compat.internal("losses_util"), tf1.losses):
    module.get_regularization_losses = _ORIGINAL["get_regularization_losses"]
  for key in _LAYERS:
    compat.set_private(compat.internal(key).Layer,
                       "_handle_weight_regularization", _ORIGINAL.pop(key))


_PATCH = patching.Patch(_install, _uninstall)
