"""`tf.compat.v1.losses` over the global batch, with no change to the model_fn.

Every `tf.compat.v1.losses` function reduces through
`compute_weighted_loss`: the weighted sum of the tower's losses, divided
(`_safe_mean`) by a count of the tower's shard that depends on the
reduction: the number of nonzero weights (`SUM_BY_NONZERO_WEIGHTS`, the
default, and `SUM_OVER_NONZERO_WEIGHTS`), the sum of the weights (`MEAN`),
the number of loss elements (`SUM_OVER_BATCH_SIZE`), or nothing (`SUM`).
One device divides by the count of the global batch, so inside the towers of
a TRAIN or EVAL graph `loss_scope` makes each term its tower's share of its
own global normalizer (`tools.global_ratio`), and a `SUM` term its tower's
share of the global sum (`tools.tower_share`). Several terms with different
normalizers in one total each get their own. The loss the tower returns, and
`get_total_loss()`, are then the tower's share: `multi_gpu` combines the
towers' shares into one device's loss.
"""

from __future__ import annotations

import contextlib
import threading

import tensorflow as tf
from tensorflow.python.ops.losses import losses_impl  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops.losses import util as losses_util  # pylint: disable=g-direct-tensorflow-import

from estimator_multigpu.cross_tower import tools

tf1 = tf.compat.v1
Reduction = tf1.losses.Reduction

_LOCK = threading.RLock()
_DEPTH = [0]  # open scopes; the patches are installed while > 0.
_ORIGINAL = {"safe_mean": losses_impl._safe_mean,  # pylint: disable=protected-access
             "compute_weighted_loss": losses_impl.compute_weighted_loss}


@contextlib.contextmanager
def loss_scope(tower):
  """Inside: `tf.compat.v1.losses` terms are the tower's global shares."""
  del tower  # the same for every tower; `tools` reads the tower context.
  with _LOCK:
    _DEPTH[0] += 1
    if _DEPTH[0] == 1:
      _install()
  try:
    yield
  finally:
    with _LOCK:
      _DEPTH[0] -= 1
      if _DEPTH[0] == 0:
        _uninstall()


def _global_mean(losses, num_present):
  """`_safe_mean` over the global batch: Σ losses / Σ num_present."""
  return tools.global_ratio(tf.reduce_sum(losses), num_present, name="value")


def _compute_weighted_loss(losses, weights=1.0, scope=None,
                           loss_collection=tf1.GraphKeys.LOSSES,
                           reduction=Reduction.SUM_BY_NONZERO_WEIGHTS):
  """`compute_weighted_loss`, with a `SUM` term as the tower's share."""
  if reduction != Reduction.SUM:
    return _ORIGINAL["compute_weighted_loss"](
        losses, weights, scope, loss_collection, reduction)
  loss = _ORIGINAL["compute_weighted_loss"](losses, weights, scope, None,
                                            reduction)
  share = tf.cast(tools.tower_share(tf.cast(loss, tf.float32)), loss.dtype)
  losses_util.add_loss(share, loss_collection)
  return share


def _install() -> None:
  losses_impl._safe_mean = _global_mean  # pylint: disable=protected-access
  for module in (losses_impl, tf1.losses):
    module.compute_weighted_loss = _compute_weighted_loss


def _uninstall() -> None:
  losses_impl._safe_mean = _ORIGINAL["safe_mean"]  # pylint: disable=protected-access
  for module in (losses_impl, tf1.losses):
    module.compute_weighted_loss = _ORIGINAL["compute_weighted_loss"]
