"""`tf.compat.v1.losses` over the global batch, with no change to the model_fn.

Every `tf.compat.v1.losses` function reduces through
`compute_weighted_loss`: the weighted sum of the tower's losses, divided
(`_safe_mean`) by a count of the tower's shard that depends on the
reduction: the number of nonzero weights (`SUM_BY_NONZERO_WEIGHTS`, the
default, and `SUM_OVER_NONZERO_WEIGHTS`), the sum of the weights (`MEAN`),
the number of loss elements (`SUM_OVER_BATCH_SIZE`), or nothing (`SUM`).
One device divides by the count of the global batch, so inside the towers of
a TRAIN or EVAL graph `loss_scope` makes each term its tower's share of its
own global normalizer (`losses.global_ratio`), and a `SUM` term its tower's
share of the global sum (`losses.tower_share`). Several terms with different
normalizers in one total each get their own. The loss the tower returns, and
`get_total_loss()`, are then the tower's share: `multi_gpu` combines the
towers' shares into one device's loss.

A per-example mean (scalar weights, or `SUM_OVER_BATCH_SIZE`, of losses
shaped [examples, fixed dims]) with `loss_reduction="mean"` needs none of
this: its normalizer is a fixed multiple of the tower's examples, so
Σᵢ (nᵢ/n)·meanᵢ is the global mean already. It stays TensorFlow's own, with
no communication between the towers.
A mean of rows counted by their values (`tf.where`, `tf.boolean_mask`:
their count is not nᵢ, as the global batch's rewrite knows) is not.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu.cross_tower import context as context_lib
from estimator_multigpu.cross_tower import losses as loss_tools
from estimator_multigpu.graph import patching
from estimator_multigpu.graph.global_batch import state as global_batch

losses_impl = compat.internal("losses_impl")
losses_util = compat.internal("losses_util")


tf1 = tf.compat.v1
Reduction = tf1.losses.Reduction

_ORIGINAL = {"safe_mean": losses_impl._safe_mean,  # pylint: disable=protected-access
             "compute_weighted_loss": losses_impl.compute_weighted_loss}


def loss_scope(tower):
  """Inside: `tf.compat.v1.losses` terms are the tower's global shares."""
  del tower  # the same for every tower; `loss_tools` reads the context.
  return _PATCH.scope()


def _global_mean(losses, num_present):
  """`_safe_mean` over the global batch: Σ losses / Σ num_present."""
  return loss_tools.global_ratio(tf.reduce_sum(losses), num_present,
                                 name="value")


def _compute_weighted_loss(losses, weights=1.0, scope=None,
                           loss_collection=tf1.GraphKeys.LOSSES,
                           reduction=Reduction.SUM_BY_NONZERO_WEIGHTS):
  """`compute_weighted_loss` over the global batch (see the module doc)."""
  with global_batch.package_ops():
    loss = _weighted_loss(losses, weights, scope, loss_collection, reduction)
  return loss if reduction == Reduction.NONE else global_batch.mark(
      loss, "share")


def _weighted_loss(losses, weights, scope, loss_collection, reduction):
  if reduction == Reduction.NONE or _tower_mean_is_exact(losses, weights,
                                                         reduction):
    with _local_means():
      return _ORIGINAL["compute_weighted_loss"](
          losses, weights, scope, loss_collection, reduction)
  if reduction != Reduction.SUM:
    return _ORIGINAL["compute_weighted_loss"](
        losses, weights, scope, loss_collection, reduction)
  loss = _ORIGINAL["compute_weighted_loss"](losses, weights, scope, None,
                                            reduction)
  share = tf.cast(loss_tools.tower_share(tf.cast(loss, tf.float32)),
                  loss.dtype)
  losses_util.add_loss(share, loss_collection)
  return share


def _tower_mean_is_exact(losses, weights, reduction) -> bool:
  """Whether the tower's own normalizer is a fixed multiple of its examples
  and its loss weight is its share of them (nᵢ/n): then Σᵢ (nᵢ/n)·meanᵢ is
  already the global mean, with no communication. So for a per-example mean
  (scalar weights, or `SUM_OVER_BATCH_SIZE`) of losses shaped [examples,
  fixed dims...] of the shard's own rows."""
  context = context_lib.current()
  if context is None or not context.example_shares:
    return False
  losses = tf.convert_to_tensor(losses)
  if global_batch.kind_of(losses) not in (None, "rows@0"):
    return False  # rows counted by their values (tf.where): not nᵢ.
  shape = losses.shape
  if shape.rank is None or shape.rank == 0 or not shape[1:].is_fully_defined():
    return False
  if isinstance(context.examples, int) and shape[0] not in (None,
                                                            context.examples):
    return False
  scalar_weights = (isinstance(weights, (int, float)) and weights != 0) or (
      isinstance(weights, tf.Tensor) and weights.shape.rank == 0)
  return reduction == Reduction.SUM_OVER_BATCH_SIZE or (
      scalar_weights and reduction != Reduction.SUM)


@contextlib.contextmanager
def _local_means():
  """Inside: `_safe_mean` is TensorFlow's own (the tower's mean)."""
  patched = losses_impl._safe_mean  # pylint: disable=protected-access
  losses_impl._safe_mean = _ORIGINAL["safe_mean"]  # pylint: disable=protected-access
  try:
    yield
  finally:
    losses_impl._safe_mean = patched  # pylint: disable=protected-access


def _install() -> None:
  losses_impl._safe_mean = _global_mean  # pylint: disable=protected-access
  for module in (losses_impl, tf1.losses):
    module.compute_weighted_loss = _compute_weighted_loss


def _uninstall() -> None:
  losses_impl._safe_mean = _ORIGINAL["safe_mean"]  # pylint: disable=protected-access
  for module in (losses_impl, tf1.losses):
    module.compute_weighted_loss = _ORIGINAL["compute_weighted_loss"]


_PATCH = patching.Patch(_install, _uninstall)
