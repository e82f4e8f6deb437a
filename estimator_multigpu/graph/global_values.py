"""The global batch's value of each argument of a readout, fed to its stub.

`global_calls` runs a readout API once, in tower 0, on *stubs* (`stub`): an
identity in place of each tensor argument computed from the shard, with its
batch dimension left unknown. Once every tower is built, `bind` feeds each
stub the global batch's value of the towers' arguments (`pieces`, in tower
order):

- per-example tensors (`tensor_kinds.ROWS`): concatenated in tower order,
  which is input order (SparseTensors too);
- a shard statistic, combined over the towers by what it is (`Combiner`):
  the tower's loss, a `LOSSES` term or an `emg.global_ratio` share
  Σᵢ wᵢ·xᵢ with the towers' loss weights, a ratio of sums
  Σᵢ numeratorᵢ / Σᵢ denominatorᵢ, a mean Σᵢ (nᵢ/n)·xᵢ, a sum or a count
  of examples Σᵢ xᵢ, a max or a min over the towers
  (`shard_statistics.statistic_kind`). A statistic of no such kind keeps
  tower 0's value, and the call is told the problem (a WARNING naming the
  API and the fix).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu.graph import dataflow
from estimator_multigpu.graph import shard_statistics
from estimator_multigpu.graph import tensor_kinds
from estimator_multigpu.graph import towers as towers_lib

tensor_util = compat.internal("tensor_util")
tf1 = tf.compat.v1


class Combiner:
  """Combines the towers' values of a shard statistic (see the module doc).

  Args:
    analysis: tower 0's `tensor_kinds.ShardAnalysis`.
    loss_kind: a loss term's kind (`shard_statistics.MEAN` for
      `loss_reduction="mean"`, else `SUM`).
    towers: the built towers (their loss weights).
    shares: each tower's share of the global batch, nᵢ / n.
  """

  def __init__(self, analysis: tensor_kinds.ShardAnalysis, loss_kind: str,
               towers: list, shares: list):
    self._analysis = analysis
    self._weights = [t.loss_weight for t in towers]
    self.shares = shares
    self._losses = _loss_terms(towers[0])
    self._known = {t.ref(): loss_kind for t in self._losses}

  def combine(self, pieces: list, problems: list) -> Optional[tf.Tensor]:
    """The global batch's value of the statistic `pieces`, or None (and a
    problem appended: (key, text))."""
    combined = self._global(pieces)
    if combined is not None:
      return combined
    problems.append((
        "statistic",
        f"reads {pieces[0].name}, a statistic of tower 0's shard that is not "
        "a mean, sum, max, min or count of its examples (a "
        f"{pieces[0].op.type}), so `multi_gpu` cannot combine it over the "
        "towers: it shows tower 0's shard. Fix: pass per-example values (the "
        "API then sees the global batch), or compute the statistic over the "
        "global batch with emg.cross_tower_sum / emg.global_ratio."))
    return None

  def _global(self, pieces: list) -> Optional[tf.Tensor]:
    """The global value of `pieces` (one per tower): the loss by the loss
    weights, a statistic by its kind, a ratio as its numerator's global
    value over its denominator's; None for one of no known kind."""
    strip = shard_statistics.strip_pass_through
    if any(strip(pieces[0]) is strip(t) for t in self._losses):
      return _weighted_sum(pieces, self._weights)
    counts = self._static_counts(pieces)
    if counts is not None:  # over a count TensorFlow folded: a ratio.
      return self._ratio(pieces, tf.constant(float(sum(counts))))
    kind = shard_statistics.statistic_kind(pieces[0], self._analysis,
                                           self._known)
    if kind != shard_statistics.RATIO:
      return _by_kind(kind, pieces, self.shares)
    return self._ratio(pieces)

  def _ratio(self, pieces: list, denominator=None) -> Optional[tf.Tensor]:
    """Σ numerators / Σ denominators of the towers' quotients `pieces`,
    each part combined by its kind (`denominator`: already combined)."""
    strip = shard_statistics.strip_pass_through
    parts = [self._global([strip(p).op.inputs[i] for p in pieces])
             for i in (0, 1)]
    if denominator is not None:
      parts[1] = denominator
    if any(part is None for part in parts):
      return None
    return tf.math.divide_no_nan(*[tf.cast(t, tf.float32) for t in parts])

  def _static_counts(self, pieces: list) -> Optional[list]:
    """The towers' denominators of quotients `pieces` when each is a
    constant proportional to its tower's examples (a count of the shard
    that TensorFlow folded: `reduce_sum(weights * ones_like(losses))` of a
    static shape, 4 and 3 over shards of 4 and 3), else None. A constant
    the same in every tower only scales the numerator."""
    strip = shard_statistics.strip_pass_through
    ops = [strip(p).op for p in pieces]
    if any(op.type not in dataflow.DIVISIONS for op in ops):
      return None
    counts = [tensor_util.try_evaluate_constant(op.inputs[1]) for op in ops]
    if any(c is None or np.ndim(c) for c in counts) or len(
        {float(c) for c in counts}) == 1:
      return None
    per_example = {float(c) / share for c, share in zip(counts, self.shares)
                   if share}
    empty_ok = all(float(c) == 0 for c, share in zip(counts, self.shares)
                   if not share)
    return [float(c) for c in counts] if len(per_example) == 1 and (
        empty_ok) else None


def bind(stub, pieces: list, kind: str, combiner: Combiner,
         problems: list) -> None:
  """Feeds `stub` the global batch's value of the towers' `pieces`: joined
  for `tensor_kinds.ROWS`, else combined (a problem if it cannot be)."""
  with tf.device(components(stub)[0].device), tf.name_scope("global_batch"):
    if kind == tensor_kinds.ROWS:
      value = _concat(pieces)
    elif kind in (shard_statistics.MEAN, shard_statistics.SUM):
      value = _by_kind(kind, pieces, combiner.shares)  # the rewrite's kind.
    else:
      value = combiner.combine(pieces, problems)
  if value is not None:
    _feed(stub, value)


def stub(leaf, rows: bool):
  """A stand-in for `leaf` whose input `bind` replaces; a per-example
  tensor's leading dimension is left unknown."""
  if isinstance(leaf, tf.SparseTensor):
    return tf.SparseTensor(_placeholder(leaf.indices, True),
                           _placeholder(leaf.values, True),
                           _placeholder(leaf.dense_shape, False))
  return _placeholder(leaf, rows)


def components(leaf) -> list:
  """The tensors of a readout's argument (a SparseTensor's three)."""
  if isinstance(leaf, tf.SparseTensor):
    return [leaf.indices, leaf.values, leaf.dense_shape]
  return [leaf] if isinstance(leaf, tf.Tensor) else []


def _placeholder(tensor: tf.Tensor, rows: bool) -> tf.Tensor:
  """An identity whose input `_feed` replaces; its input's shape (the one
  a new input must agree with) has an unknown first dimension for `rows`."""
  shape = tensor.shape
  if rows and shape.rank:
    shape = tf.TensorShape([None]).concatenate(shape[1:])
  return tf.identity(tf1.placeholder_with_default(tensor, shape),
                     name="global_batch_stub")


def _feed(target, value) -> None:
  for placeholder, tensor in zip(components(target), components(value)):
    compat.private(placeholder.op, "_update_input")(
        0, tf.cast(tensor, placeholder.dtype))


def _concat(pieces: list) -> Any:
  if isinstance(pieces[0], tf.SparseTensor):
    return tf.sparse.concat(0, pieces, expand_nonconcat_dims=True)
  return tf.concat(pieces, axis=0)


def _by_kind(kind: Optional[str], pieces: list, shares: list):
  """The towers' `pieces` of a mean, sum, max or min combined, else None."""
  if kind == shard_statistics.MEAN:
    return _weighted_sum(pieces, shares)
  if kind == shard_statistics.SUM:
    return tf.math.add_n(pieces)
  if kind in (shard_statistics.MAX, shard_statistics.MIN):
    reduce = tf.reduce_max if kind == shard_statistics.MAX else tf.reduce_min
    return reduce(tf.stack(pieces), axis=0)
  return None


def _weighted_sum(pieces: list, weights: list) -> tf.Tensor:
  return tf.math.add_n([tf.math.multiply_no_nan(p, tf.cast(w, p.dtype))
                        for p, w in zip(pieces, weights)])




def _loss_terms(tower0) -> list:
  """Tower 0's tensors the towers' loss weights combine: its loss, its
  `LOSSES` terms and its `emg.global_ratio` shares."""
  terms = [tower0.spec.loss] + list(
      tower0.collections.get(tf1.GraphKeys.LOSSES, [])) + [
          ratio for ratio, _ in tower0.collections.get(
              towers_lib.NORMALIZERS, [])]
  return [t for t in terms if isinstance(t, tf.Tensor)]
