"""Losses normalized by, or coupled across, the global batch.

On one device a loss may divide by a count of the batch (valid tokens,
Object Detection's matched anchors, `params['batch_size']`) or let examples
see each other (in-batch negatives, contrastive losses). Inside the towers
of `multi_gpu` each tower holds only its shard, so these tools exchange what
the loss needs between the towers, forward and backward
(`collectives.all_reduce_sum`):

- `global_ratio(numerator, denominator)`: this tower's share of
  Σnumerator / Σdenominator over the towers; `multi_gpu` combines the
  towers' losses as Σᵢ wᵢ·lossᵢ (wᵢ: the tower's share of the global batch,
  rule 2), so the combined loss, and its gradient, is the global ratio.
- `cross_tower_sum(x)`: Σ over the towers.
- `cross_tower_concat(x)`: every tower's `x` along axis 0, in tower order
  (input order).

Each is the plain operation outside `multi_gpu`, with one tower, and in an
exported graph. Every tower must make the same calls in the same order, and
the tensors must be fetched in the step's `session.run` (the loss and the
train_op are).
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from estimator_multigpu import collectives
from estimator_multigpu.cross_tower import context as context_lib
from estimator_multigpu.graph.global_batch import state as global_batch
from estimator_multigpu.graph.towers import NORMALIZERS

tf1 = tf.compat.v1


def _context() -> Optional[context_lib.TowerContext]:
  context = context_lib.current()
  return context if context and context.group.num_towers > 1 else None


def cross_tower_sum(x, name: Optional[str] = None) -> tf.Tensor:
  """Σ over the towers of `x` (same shape and dtype in every tower).

  Its gradient reaches every tower's `x` with the weight of each tower's
  loss, so a loss built from the sum trains like one device's.
  """
  with tf.name_scope(name or "cross_tower_sum"), global_batch.package_ops():
    x = tf.convert_to_tensor(x)
    context = _context()
    if context is None:
      return tf.identity(x)
    return global_batch.mark(collectives.all_reduce_sum(
        x, context.group, context.tower_index, context.device,
        context.loss_weight), "uniform")


def global_ratio(numerator: tf.Tensor, denominator: tf.Tensor,
                 name: Optional[str] = None) -> tf.Tensor:
  """This tower's share of Σnumerator / Σdenominator over the towers.

  Use it where one device divides a sum over the batch by a count of the
  batch: `global_ratio(tf.reduce_sum(token_losses * mask),
  tf.reduce_sum(mask))` is the token-level mean of the global batch once
  `multi_gpu` combines the towers. Outside `multi_gpu`: numerator /
  denominator.

  Args:
    numerator: this tower's sum (a float tensor).
    denominator: this tower's count; cast to the numerator's dtype.
    name: optional name scope.

  An argument the same in every tower (what the global batch's rewrite
  already made the global batch's value, such as `tf.maximum(num_matches,
  1.0)` of a count of the batch, a constant, a variable) is one device's
  value already and is not summed again.

  Returns:
    numerator / (wᵢ · Σⱼ denominatorⱼ), 0 for an empty shard (wᵢ = 0).
  """
  numerator_global = global_batch.is_global(numerator)
  denominator_global = global_batch.is_global(denominator)
  with tf.name_scope(name or "global_ratio"), global_batch.package_ops():
    numerator = tf.convert_to_tensor(numerator)
    denominator = tf.cast(denominator, numerator.dtype)
    context = _context()
    if context is None:
      ratio = numerator / denominator
      tf1.add_to_collection(NORMALIZERS, (ratio, denominator))
      return ratio
    total = denominator if denominator_global else cross_tower_sum(
        denominator)
    if numerator_global:  # one device's ratio, in every tower.
      ratio = global_batch.share_of_global(numerator / total)
    else:
      ratio = tf.math.divide_no_nan(
          numerator, _share(context, numerator.dtype) * total)
    tf1.add_to_collection(NORMALIZERS, (ratio, total))
    return global_batch.mark(ratio, "share")


def tower_share(total, name: Optional[str] = None) -> tf.Tensor:
  """This tower's share of a sum over the global batch: Σᵢ of these over the
  towers, combined by `multi_gpu`, is Σ total (`total` / wᵢ; 0 if wᵢ = 0).
  A `total` the same in every tower (the global batch's, made so by the
  rewrite) counts once."""
  total_global = global_batch.is_global(total)
  with tf.name_scope(name or "tower_share"), global_batch.package_ops():
    total = tf.convert_to_tensor(total)
    context = _context()
    if context is None:
      return tf.identity(total)
    if total_global:  # the global batch's sum already, in every tower.
      return global_batch.mark(global_batch.share_of_global(total), "share")
    return global_batch.mark(
        tf.math.divide_no_nan(total, _share(context, total.dtype)), "share")


def _share(context: context_lib.TowerContext, dtype) -> tf.Tensor:
  weight = 1.0 if context.loss_weight is None else context.loss_weight
  return tf.cast(weight, dtype)


def cross_tower_concat(x, name: Optional[str] = None) -> tf.Tensor:
  """Every tower's `x` along axis 0, in tower order (all-gather).

  Shards may differ in size (or be empty); the other axes must agree. The
  gradient of each row reaches the tower that holds it. For in-batch
  negatives, gather both sides and compute the loss of the whole global
  batch in every tower (docs/losses.md has the recipe).
  """
  with tf.name_scope(name or "cross_tower_concat"), \
      global_batch.package_ops():
    x = tf.convert_to_tensor(x)
    context = _context()
    if context is None:
      return tf.identity(x)
    if x.shape.rank is None or x.shape.rank == 0:
      raise ValueError(
          f"`cross_tower_concat` joins tensors along axis 0; got {x!r} of "
          "unknown rank or a scalar. Pass a tensor with a batch axis.")
    offset, total = row_offsets(tf.shape(x)[0], context)
    rows = tf.shape(x)[0]
    paddings = [[offset, total - offset - rows]] + [[0, 0]] * (
        x.shape.rank - 1)
    gathered = cross_tower_sum(tf.pad(x, paddings))
    return global_batch.mark(
        tf.ensure_shape(gathered, [None] + x.shape.as_list()[1:]), "uniform")


def row_offsets(rows: tf.Tensor, context: context_lib.TowerContext) -> tuple:
  """(this tower's first row, the total rows) of the concatenation."""
  one_hot = tf.one_hot(context.tower_index, context.group.num_towers,
                       dtype=tf.float64) * tf.cast(rows, tf.float64)
  sizes = tf.cast(collectives.all_reduce_sum(
      tf.stop_gradient(one_hot), context.group, context.tower_index,
      context.device), tf.int32)
  return tf.reduce_sum(sizes[:context.tower_index]), tf.reduce_sum(sizes)
