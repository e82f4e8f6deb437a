"""Clipping: the one clip of the update chain, and the warning for a clip
written inside the model_fn.

`clip_by_global_norm` is the chain's clip step (`multi_gpu(
clip_gradients_by_norm=...)`): it clips each optimizer call's combined
gradients, which cover the global batch, as one device would. A clip inside
the model_fn acts on one tower's gradient before the towers are combined;
`warn_if_transformed` says so once per model.
"""

from __future__ import annotations

import itertools

import tensorflow as tf

from estimator_multigpu.graph import dataflow
from estimator_multigpu.graph import warn_once
from estimator_multigpu.update import chain as chain_lib


def clip_by_global_norm(grads_and_vars: list, clip_norm: float) -> list:
  """Clips the gradients (None skipped) to a global norm of `clip_norm`."""
  present = [(g, v) for g, v in grads_and_vars if g is not None]
  clipped, _ = tf.clip_by_global_norm([g for g, _ in present], clip_norm)
  by_variable = {id(v): g for (_, v), g in zip(present, clipped)}
  return [(by_variable.get(id(v)), v) for _, v in grads_and_vars]


_SEARCH_LIMIT = 4000  # ops visited per factor before giving up (no warning).
TRANSFORMED_COLLECTION = "estimator_multigpu_per_tower_gradient_transforms"
NOISY_COLLECTION = "estimator_multigpu_per_tower_gradient_noise"
# The elementwise walk, and the sums where noise joins a gradient.
_ELEMENTWISE_OR_SUMS = dataflow.ELEMENTWISE | dataflow.SIGNED_SUMS


def find_transformed(grads_and_vars: list, computed: frozenset = frozenset()
                     ) -> list:
  """The variables whose gradient went through a per-tower transform.

  Found from the graph's structure, whatever the ops are named: walking back
  from each gradient through elementwise ops that keep its variable's shape
  (`dataflow.ELEMENTWISE`) reaches the gradient the model_fn computed; the
  walk is a transform that one device would apply to the whole batch's
  gradient if it clips by value (a min or max along the way) or scales by a
  factor computed from gradients (a norm: `clip_by_norm`,
  `clip_by_global_norm`). Scaling
  by a constant is linear, hence exact. `computed`: ids of the gradients
  `TowerOptimizer.compute_gradients` returned, where the walk stops.
  """
  chains = [_chain(g, computed) for g, v in grads_and_vars if g is not None]
  raw = set().union(*[set(chain) for chain, _ in chains]) if chains else set()
  names = []
  for (chain, factors), (g, v) in zip(
      chains, [(g, v) for g, v in grads_and_vars if g is not None]):
    del g
    if _nonlinear(chain) or any(_reads(factor, raw) for factor in factors):
      names.append(v.op.name)
  return names


def _values(grad) -> tf.Tensor:
  return grad.values if isinstance(grad, tf.IndexedSlices) else grad


def _chain(grad, computed: frozenset, through=dataflow.ELEMENTWISE) -> tuple:
  """(tensors of the elementwise walk back from `grad` through the op types
  `through`, the side inputs)."""
  tensor = _values(grad)
  shape = tensor.shape
  chain, factors, stack = [], [], [tensor]
  while stack:
    current = stack.pop()
    chain.append(current)
    if current.op.type not in through or id(current) in computed:
      continue
    for operand in current.op.inputs:
      # Compatible, not equal: over a shard of unknown size a gradient's
      # static shape may be partly unknown ([None, 1] for a [1, 1] kernel).
      if operand.shape.rank and operand.shape.is_compatible_with(shape):
        stack.append(operand)
      else:
        factors.append(operand)
  return chain, factors


def _nonlinear(chain: list) -> bool:
  return any(t.op.type in dataflow.CLIPS_BY_VALUE for t in chain)


def _reads(factor: tf.Tensor, raw: set) -> bool:
  """Whether `factor` is computed from any tensor in `raw` (within the
  first `_SEARCH_LIMIT` ops it reads)."""
  ops = itertools.islice(dataflow.walk([factor]), _SEARCH_LIMIT)
  return factor in raw or any(t in raw for op in ops for t in op.inputs)


def warn_if_transformed(grads_and_vars: list,
                        computed: frozenset = frozenset()) -> list:
  """Warns (once per model) when a tower's gradients were transformed per
  tower.

  Returns:
    The names of the variables whose gradients were (also recorded in the
    graph collection `TRANSFORMED_COLLECTION`, for `check_towers`).
  """
  return _record_and_warn_once(
      find_transformed(grads_and_vars, computed), TRANSFORMED_COLLECTION,
      "multi_gpu: the model_fn transforms its gradients inside each tower "
        "before applying them (%s: clip_by_global_norm, clip_by_norm, "
        "clip_by_value or another transform that depends on the gradients' "
        "values), so each tower's own gradient is transformed before the "
        "towers are combined; one device transforms the gradient of the "
        "whole batch. To clip exactly as on one device, remove the clip from "
        "the model_fn and pass multi_gpu(..., clip_gradients_by_norm=<the "
        "same norm>).")


def warn_if_noisy(grads_and_vars: list,
                  computed: frozenset = frozenset()) -> list:
  """Warns (once per model) when random noise is added to a tower's
  gradients.

  Found from the graph's structure: the elementwise walk back from a
  gradient (see `find_transformed`) reaches a random op. Each tower adds
  its own draw, weighted by its share wᵢ of the global batch, so the
  combined noise has √Σwᵢ² of one device's standard deviation (0.71 on 2
  even towers). Returns the variables' names (also recorded in the graph
  collection `NOISY_COLLECTION`, for `check_towers`).
  """
  names = [v.op.name for g, v in grads_and_vars if g is not None and any(
      dataflow.draws_random(t.op)
      for t in _chain(g, computed, _ELEMENTWISE_OR_SUMS)[0])]
  return _record_and_warn_once(
      names, NOISY_COLLECTION,
      "multi_gpu: the model_fn adds random noise to its gradients inside "
        "each tower (%s; e.g. optimize_loss(gradient_noise_scale=...)): the "
        "towers' draws are combined with their batch shares, so the noise "
        "has less than one device's standard deviation (1/sqrt(towers) for "
        "even shards). Add the noise once to the combined gradients instead:"
        " an optimizer that wraps the inner one, inside TowerOptimizer.")


def _record_and_warn_once(names: list, collection: str, message: str) -> list:
  """Records `names` in the graph `collection` (for `check_towers`); warns
  `message` (its %s: the first names) once per model and mode
  (`warn_once`)."""
  for name in names:
    tf.compat.v1.add_to_collection(collection, name)
  if names:
    warn_once.warn(collection, message, ", ".join(names[:3]) +
                   (" ..." if len(names) > 3 else ""))
  return names


def signature(grads_and_vars: list, computed: frozenset = frozenset()
              ) -> list:
  """Per gradient, the op types of its elementwise walk back (None for a
  None gradient): towers whose signatures differ transformed their
  gradients differently (`strategies.base.warn_if_transformed_differently`).
  """
  return [None if g is None else tuple(
      t.op.type for t in _chain(g, computed, _ELEMENTWISE_OR_SUMS)[0])
          for g, _ in grads_and_vars]


class ClipByGlobalNorm(chain_lib.UpdateStep):
  """The update chain's clip step: each optimizer call's combined
  gradients to a global norm of `clip_norm` (`clip_gradients_by_norm`)."""

  name = "clip"

  def __init__(self, clip_norm: float):
    self.clip_norm = clip_norm

  def transform(self, update) -> list:
    with tf.name_scope("clip_gradients"):
      return clip_by_global_norm(update.grads_and_vars, self.clip_norm)
