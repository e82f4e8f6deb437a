"""Moments of the global batch, computed inside one tower.

`cross_tower_moments(x, axes)` returns what `tf.nn.moments(x, axes)` returns
on one device for the whole global batch, while each tower only holds its
shard: every tower sums its shard's statistics, one all-reduce per call adds
them up (`collectives.all_reduce_sum`, gradients included), and every tower
divides by the global count. Uneven shards are weighted by their counts;
empty shards contribute nothing.

Numerics. Each tower sums x - c and (x - c)² in the input's precision with
the shift c = its local mean (two passes, like `tf.nn.moments`), and turns
them into exact float64 sums Σx = Σ(x - c) + n·c and
Σx² = Σ(x - c)² + 2c·Σ(x - c) + n·c². Only those 3·C numbers
(C = channels) are all-reduced, as float64, and E[x²] - E[x]² is taken in
float64, so the variance does not cancel catastrophically for data far from
zero. The identities hold for any c, so c carries no gradient.

Where it applies: inside any tower of `multi_gpu` with more than one tower
(`sync_batch_norm=True` only decides whether batch-norm layers use it);
anywhere else (one tower, outside `multi_gpu`, export) these are the local
moments of `x`, which are the whole batch's.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import tensorflow as tf

from estimator_multigpu import collectives
from estimator_multigpu.cross_tower import context as context_lib
from estimator_multigpu.graph import tensor_kinds
from estimator_multigpu.graph.global_batch import state as global_batch

tf1 = tf.compat.v1
_ORIGINAL_FUSED_BATCH_NORM = tf1.nn.fused_batch_norm


def current_context() -> Optional[context_lib.TowerContext]:
  """The innermost context whose batch-norm moments are synchronized."""
  return context_lib.current(synchronize_moments=True)


def _synchronized() -> Optional[context_lib.TowerContext]:
  context = current_context()
  return context if context and context.group.num_towers > 1 else None


def _across_towers() -> Optional[context_lib.TowerContext]:
  """Any multi-tower context: `cross_tower_moments` called by the model_fn
  is global with or without sync_batch_norm (which only patches the
  batch-norm layers)."""
  context = context_lib.current()
  return context if context and context.group.num_towers > 1 else None


def tower_context(tower_index: int, group: collectives.Group,
                  loss_weight: Any = None):
  """Makes `cross_tower_moments` inside reduce over `group`'s towers.

  `loss_weight` is the tower's share of the global batch, which its
  gradients are multiplied by (`collectives.all_reduce_sum`).
  """
  return context_lib.tower_context(tower_index, group, loss_weight,
                                   synchronize_moments=True)


def cross_tower_moments(x: tf.Tensor, axes: Sequence[int],
                        keepdims: bool = False,
                        frequency_weights: Optional[tf.Tensor] = None,
                        name: Optional[str] = None
                        ) -> Tuple[tf.Tensor, tf.Tensor]:
  """Mean and (biased) variance of `x` over `axes` and the global batch.

  A drop-in for `tf.nn.moments` (or `tf.nn.weighted_moments` with
  `frequency_weights`) for custom normalization code in a `model_fn`: inside
  the towers of `multi_gpu` (with or without `sync_batch_norm`, which only
  decides whether batch-norm layers use it) the moments cover every tower's
  shard, exactly as one device would compute them on the global batch, and
  gradients flow back to every tower. Elsewhere (one tower, export, outside
  `multi_gpu`) they are the local moments, the whole batch's. Every tower
  must make the same calls in the same order.

  Examples:
    >>> mean, variance = emg.cross_tower_moments(x, axes=[0, 1, 2])
    >>> y = tf.nn.batch_normalization(x, mean, variance, beta, gamma, 1e-3)

  Args:
    x: this tower's shard (batch on axis 0; it may be empty), known rank.
    axes: the axes to reduce; include 0, the batch axis.
    keepdims: keep the reduced axes with length 1.
    frequency_weights: optional weights broadcastable to `x`, e.g. a mask.
    name: optional name scope.

  Returns:
    `(mean, variance)` in the dtype of `x` (float32 for 16-bit inputs).

  Raises:
    ValueError: `x` has unknown rank.
  """
  mean, variance, _ = global_statistics(x, axes, keepdims, frequency_weights,
                                        name)
  return mean, variance


def global_statistics(x, axes, keepdims=False, frequency_weights=None,
                      name=None):
  """`cross_tower_moments` plus the global count, in the same shape."""
  x = tf.convert_to_tensor(x)
  if x.shape.rank is None:
    raise ValueError(
        f"`cross_tower_moments` needs an input of known rank; got {x!r}. "
        "Give it a static shape (e.g. tf.ensure_shape) first.")
  axes = sorted({int(axis) % x.shape.rank for axis in axes})
  with tf1.name_scope(name, "cross_tower_moments", [x]), \
      global_batch.package_ops():
    dtype = tf.float32 if x.dtype in (tf.float16, tf.bfloat16) else x.dtype
    sums, shape = _float64_sums(tf.cast(x, dtype), axes, frequency_weights)
    context = _across_towers()
    if context is not None:
      sums = collectives.all_reduce_sum(sums, context.group,
                                        context.tower_index, context.device,
                                        context.loss_weight)
    mean, variance, count = _moments_from_sums(sums)
    results = [tf.reshape(tf.cast(t, dtype), shape)
               for t in (mean, variance, count)]
    return results if keepdims else [tf.squeeze(t, axes) for t in results]


def _float64_sums(x: tf.Tensor, axes: list, weights):
  """[Σx, Σx², n] per channel as one float64 vector, and the stats' shape."""
  if weights is not None:
    weights = tf.broadcast_to(tf.cast(weights, x.dtype), tf.shape(x))
  weigh = (lambda t: t) if weights is None else (lambda t: weights * t)
  local_sum = tf.reduce_sum(weigh(x), axes, keepdims=True)
  count = _count(x, axes, weights, local_sum)
  shift = tf.stop_gradient(tf.math.divide_no_nan(local_sum, count))
  centered = x - shift
  tensor_kinds.mark_shift_invariant(centered.op)  # Σ over towers undoes it.
  shifted_sum = tf.reduce_sum(weigh(centered), axes, keepdims=True)
  shifted_squares = tf.reduce_sum(weigh(centered) * centered, axes,
                                  keepdims=True)
  flat = lambda t: tf.reshape(tf.cast(t, tf.float64), [-1])
  n, c, s = flat(count), flat(shift), flat(shifted_sum)
  # Exact for any c: Σx = Σ(x-c) + nc;  Σx² = Σ(x-c)² + 2cΣ(x-c) + nc².
  total = s + n * c
  squares = flat(shifted_squares) + (2.0 * s + n * c) * c
  return tf.concat([total, squares, n], axis=0), tf.shape(local_sum)


def _count(x, axes, weights, like):
  """Examples per channel (0 for an empty shard), shaped like `like`."""
  if weights is not None:
    return tf.reduce_sum(weights, axes, keepdims=True)
  size = tf.reduce_prod(tf.gather(tf.shape(x), axes))
  return tf.fill(tf.shape(like), tf.cast(size, x.dtype))


def _moments_from_sums(sums: tf.Tensor):
  """(mean, biased variance, count) from [Σx, Σx², n], in float64."""
  total, squares, count = tf.split(sums, 3, axis=0)
  mean = total / count
  variance = tf.maximum(squares / count - tf.square(mean), 0.0)
  return mean, variance, count


def sync_fused_batch_norm(x, scale, offset, mean=None, variance=None,
                          epsilon=0.001, data_format="NHWC", is_training=True,
                          name=None, exponential_avg_factor=1.0):
  """`tf.compat.v1.nn.fused_batch_norm` over the global batch in training.

  Inside a synchronized tower with `is_training=True`, `y` is normalized
  with the global mean and biased variance, and the returned variance carries
  Bessel's correction n/(n-1) with the global count n, as the fused kernel
  does with its batch's, so moving averages match one device. Otherwise it
  is the original op. Arguments and results are the op's.
  """
  if is_training is not True or _synchronized() is None:
    return _ORIGINAL_FUSED_BATCH_NORM(
        x, scale, offset, mean=mean, variance=variance, epsilon=epsilon,
        data_format=data_format, is_training=is_training, name=name,
        exponential_avg_factor=exponential_avg_factor)
  with tf1.name_scope(name, "SyncFusedBatchNorm", [x, scale, offset]):
    x = tf.convert_to_tensor(x)
    channel = 1 if data_format.startswith("NC") else x.shape.rank - 1
    batch_mean, batch_var, count = global_statistics(
        x, [a for a in range(x.shape.rank) if a != channel])
    y = _normalize(x, batch_mean, batch_var, scale, offset, epsilon, channel)
    corrected = batch_var * count / tf.maximum(count - 1.0, 1.0)
    factor = 1.0 if exponential_avg_factor is None else exponential_avg_factor
    if factor != 1.0:
      batch_mean = (1.0 - factor) * mean + factor * batch_mean
      corrected = (1.0 - factor) * variance + factor * corrected
    return y, batch_mean, corrected


def _normalize(x, mean, variance, scale, offset, epsilon, channel):
  """(x - mean) · scale / sqrt(variance + ε) + offset, per channel."""
  broadcast = [1] * x.shape.rank
  broadcast[channel] = -1
  multiplier = tf.math.rsqrt(variance + epsilon) * tf.cast(scale, mean.dtype)
  shift = tf.cast(offset, mean.dtype) - mean * multiplier
  y = (tf.cast(x, mean.dtype) * tf.reshape(multiplier, broadcast)
       + tf.reshape(shift, broadcast))
  return tf.cast(y, x.dtype)
