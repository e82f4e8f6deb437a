"""Synchronized batch norm: `multi_gpu(..., sync_batch_norm=True)`.

`tower_scope(tower)` is entered around each tower's model_fn call
(`towers.build_towers`' `tower_scopes`, TRAIN mode, more than one tower).
Inside it, batch-norm layers in training mode normalize with the moments of
the global batch (`moments.cross_tower_moments`), so N towers compute one
device's outputs, gradients and moving statistics. The layers are reached at
three points, installed while a scope is open and removed after:

1. Keras `BatchNormalizationBase._moments` (non-fused path): covers
   `tf.keras.layers.BatchNormalization`, `tf.compat.v1.layers.
   batch_normalization` / `BatchNormalization` and tf-slim's default path.
   Left local with `virtual_batch_size` (ghost batches are per tower).
2. Keras `BatchNormalizationBase._fused_batch_norm` (fused path): for the
   duration of the call `tf.compat.v1.nn.fused_batch_norm` is
   `moments.sync_fused_batch_norm`.
3. tf-slim's own paths (`slim.batch_norm` on 2-D inputs with `fused`, or
   with zero-debiasing or other update collections): tf-slim's `nn` module
   becomes a stand-in whose `fused_batch_norm`, `moments` and
   `weighted_moments` reduce over the global batch when they reduce axis 0
   (`slim.layer_norm` stays local).

Moving statistics. Every tower's update ops are built from the global
moments, so tower 0's UPDATE_OPS, which `multi_gpu` runs once per step, give
exactly one device's update, even when tower 0's own shard is empty.

Not covered: direct calls of `tf.nn.moments` / `tf.nn.fused_batch_norm` in a
model_fn (use `cross_tower_moments` / `moments.sync_fused_batch_norm`).
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

import tensorflow as tf

from estimator_multigpu import collectives
from estimator_multigpu import compat
from estimator_multigpu.cross_tower import context as context_lib
from estimator_multigpu.cross_tower import moments
from estimator_multigpu.graph import patching
from estimator_multigpu.graph import state_updates
from estimator_multigpu.graph import warn_once
from estimator_multigpu.graph.global_batch import state as global_batch

tf1 = tf.compat.v1


def scope_factory(group: collectives.Group):
  """The `towers.build_towers` scope factory for towers of `group`.

  Returns:
    `tower -> context manager` synchronizing that tower's batch norm (tower
    i of this graph is `group.first_local + i`).
  """
  return lambda tower: tower_scope(group.first_local + tower.index, group,
                                   tower.loss_weight)


@contextlib.contextmanager
def tower_scope(tower_index: int, group: collectives.Group,
                loss_weight: Any = None):
  """Batch norm built inside reduces over `group`'s towers.

  `loss_weight`: the tower's share of the global batch (its gradients are
  multiplied by it after they are computed).

  After the last tower, checks that every tower built the same all-reduces
  (`collectives.check_complete`): a mismatch would hang the first step.
  """
  with moments.tower_context(tower_index, group, loss_weight), _patched():
    yield
  if tower_index == group.last_local:
    collectives.check_complete()


@contextlib.contextmanager
def per_tower_scope(tower):
  """Without `sync_batch_norm`: batch norm stays per tower, and a layer that
  normalizes with batch statistics warns (once per model) that it does."""
  del tower
  with _patched():
    yield


def _per_tower(training: Any = True) -> None:
  """A batch-norm layer is normalizing one tower's shard: warn (once per
  model and mode, `warn_once`)."""
  context = context_lib.current()
  if context is None or context.group.num_towers == 1 or training is False:
    return
  warn_once.warn(
      "batch_norm_per_tower",
      "multi_gpu: batch norm in training normalizes each tower's shard with "
      "that shard's own statistics (%d towers), so its outputs, gradients "
      "and moving statistics differ from one device's on the global batch. "
      "Pass multi_gpu(..., sync_batch_norm=True) (train.py "
      "--sync_batch_norm) for one device's numbers.", context.group.num_towers)


def _install() -> None:
  base = _keras_batch_norm_base()
  for name, wrap in _KERAS_WRAPS:
    compat.set_private(base, name, wrap(compat.private(base, name)))
  slim_layers = _slim_layers()
  if slim_layers is not None:
    slim_layers.nn = _SlimNN(slim_layers.nn)
    slim_layers.moving_averages = _SlimMovingAverages(
        slim_layers.moving_averages)


def _uninstall() -> None:
  base = _keras_batch_norm_base()
  for name, _ in _KERAS_WRAPS:
    compat.set_private(base, name, compat.private(base, name).original)
  slim_layers = _slim_layers()
  if slim_layers is not None and isinstance(slim_layers.nn, _SlimNN):
    slim_layers.nn = slim_layers.nn.module
    slim_layers.moving_averages = slim_layers.moving_averages.module


def _keras_batch_norm_base() -> type:
  return compat.internal("keras_batch_norm").BatchNormalizationBase


_PATCH = patching.Patch(_install, _uninstall)
_KERAS_WRAPS = (("_moments", lambda o: _keras_moments(o)),
                ("_fused_batch_norm", lambda o: _keras_fused(o)),
                ("_assign_moving_average", lambda o: _own_moving_average(o)))
_patched = _PATCH.scope


def is_installed() -> bool:
  """Whether the layer interception is in place (a scope is open)."""
  return _PATCH.installed


def _slim_layers():
  try:
    return importlib.import_module("tf_slim.layers.layers")
  except ImportError:
    return None


def _own_moving_average(original):
  """A layer's write of its moving statistics, built as the package's: per
  shard without `sync_batch_norm` (the layer's warning), global with it;
  never rewritten (an all-reduce per moving average would cost every net
  its speed)."""

  def assign(*args, **kwargs):
    with global_batch.package_ops():
      return original(*args, **kwargs)

  assign.original = original
  return assign


class _SlimMovingAverages:
  """tf-slim's view of `moving_averages`: a layer's own (`_own_moving_average`)."""

  def __init__(self, module):
    self.module = module
    self.assign_moving_average = _own_moving_average(
        module.assign_moving_average)

  def __getattr__(self, name):
    return getattr(self.module, name)


def _keras_moments(original):
  """`BatchNormalizationBase._moments` over the global batch."""

  def _moments(self, inputs, reduction_axes, keep_dims, mask=None):
    if (moments.current_context() is None
        or self.virtual_batch_size is not None):
      _per_tower()
      return _own_statistics(lambda: original(
          self, inputs, reduction_axes, keep_dims, mask=mask))
    weights = (None if mask is None else
               tf.expand_dims(tf.cast(mask, inputs.dtype), axis=-1))
    return moments.cross_tower_moments(inputs, reduction_axes,
                                       keepdims=keep_dims,
                                       frequency_weights=weights)

  _moments.original = original
  return _moments


def _keras_fused(original):
  """`BatchNormalizationBase._fused_batch_norm` with the synchronized op."""

  def _fused_batch_norm(self, inputs, mask, training):
    if moments.current_context() is None:
      _per_tower(training)
      output = original(self, inputs, mask, training)
      _own_statistics(lambda: _fused_statistics(output))
      return output
    nn_module = tf1.nn  # Keras looks the op up here at call time.
    previous = nn_module.fused_batch_norm
    nn_module.fused_batch_norm = moments.sync_fused_batch_norm
    try:
      return original(self, inputs, mask, training)
    finally:
      nn_module.fused_batch_norm = previous

  _fused_batch_norm.original = original
  return _fused_batch_norm


class _SlimNN:
  """tf-slim's view of `tensorflow.python.ops.nn`, batch moments global."""

  def __init__(self, module):
    self.module = module

  def __getattr__(self, name):
    return getattr(self.module, name)

  @staticmethod
  def fused_batch_norm(*args, **kwargs):
    if moments.current_context() is None:
      _per_tower(kwargs.get("is_training", True))
      result = moments.sync_fused_batch_norm(*args, **kwargs)
      _own_statistics(lambda: result[1:3], kwargs.get("is_training", True))
      return result
    return moments.sync_fused_batch_norm(*args, **kwargs)

  def moments(self, x, axes, shift=None, name=None, keep_dims=None,
              keepdims=None):
    if not _reduces_batch(x, axes):
      return _own_statistics(lambda: self.module.moments(
          x, axes, shift=shift, name=name, keep_dims=keep_dims,
          keepdims=keepdims), _batch_axis(x, axes))
    return moments.cross_tower_moments(
        x, axes, keepdims=bool(keepdims or keep_dims), name=name)

  def weighted_moments(self, x, axes, frequency_weights, name=None,
                       keep_dims=None, keepdims=None):
    if not _reduces_batch(x, axes):
      return _own_statistics(lambda: self.module.weighted_moments(
          x, axes, frequency_weights, name=name, keep_dims=keep_dims,
          keepdims=keepdims), _batch_axis(x, axes))
    return moments.cross_tower_moments(
        x, axes, keepdims=bool(keepdims or keep_dims),
        frequency_weights=frequency_weights, name=name)


def _own_statistics(compute, batch: bool = True):
  """`compute()`, a layer's mean and variance of its tower's shard (when
  `batch`), marked: the moving averages written from them are this
  module's warning's (`state_updates` does not warn about them again), and
  the global batch's rewrite keeps them the shard's (its ops are not
  rewritten; what reads them stays per shard: normalization, moving
  averages), as the warning says."""
  with global_batch.package_ops():
    result = compute()
  if batch:
    state_updates.mark_batch_norm_statistics(result)
    for tensor in tf.nest.flatten(result):
      if isinstance(tensor, tf.Tensor):
        global_batch.mark(tensor, "shard")
  return result


def _fused_statistics(output) -> list:
  """The batch mean and variance beside a fused batch norm's output (none
  when a `tf.cond` on `training` hides the op)."""
  op = output.op
  return list(op.outputs[1:3]) if op.type.startswith("FusedBatchNorm") else []


def _batch_axis(x, axes) -> bool:
  """Whether moments of `x` over `axes` reduce the batch axis."""
  rank = tf.convert_to_tensor(x).shape.rank
  return rank is not None and 0 in [axis % rank for axis in axes]


def _reduces_batch(x, axes) -> bool:
  """Whether moments of `x` over `axes` are batch statistics to share."""
  batch = _batch_axis(x, axes)
  if batch and moments.current_context() is None:
    _per_tower()
  return batch and moments.current_context() is not None
