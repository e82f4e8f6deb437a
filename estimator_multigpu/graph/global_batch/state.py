"""Which tower's rewrite is active in this thread, and what package code
declares about the tensors it builds (no TensorFlow ops of its own)."""

from __future__ import annotations

import contextlib
import threading
from typing import Optional

import tensorflow as tf

from estimator_multigpu.compat import op_hooks
from estimator_multigpu.graph.global_batch import kinds as K

_STATE = threading.local()


def current():
  """The `rewrite.TowerRewrite` of the tower this thread builds, or None."""
  stack = getattr(_STATE, "stack", [])
  return stack[-1] if stack else None


def _hook(*args, **kwargs):
  rewrite = current()
  return None if rewrite is None else rewrite.hook(*args, **kwargs)


@contextlib.contextmanager
def tower_scope(rewrite):
  """Inside, ops built in this thread go through `rewrite`."""
  _STATE.stack = getattr(_STATE, "stack", []) + [rewrite]
  try:
    with op_hooks.installed("global_batch", _hook):
      yield rewrite
  finally:
    _STATE.stack = _STATE.stack[:-1]


@contextlib.contextmanager
def package_ops():
  """Inside, ops are classified, not rewritten: the package's own
  cross-tower tools build them."""
  rewrite = current()
  if rewrite is None:
    yield
    return
  rewrite.suspended += 1
  try:
    yield
  finally:
    rewrite.suspended -= 1


def mark(tensor: tf.Tensor, kind_name: str) -> tf.Tensor:
  """Declares what a package tool returned: "uniform" (the same in every
  tower), "share" (the tower's share of a global value, combined with
  the towers' loss weights) or "shard" (a statistic of the shard the
  package keeps per tower by design, batch norm without `sync_batch_norm`:
  to the table a constant of the tower, so what reads it stays per
  shard)."""
  rewrite = current()
  if rewrite is not None:
    rewrite.set_kind(tensor, rewrite.share_kind if kind_name == "share"
                     else K.UNIFORM)
  return tensor


def is_global(tensor) -> Optional[bool]:
  """Whether `tensor` (or a number) is the same in every tower being
  rewritten, so it is already one device's value (a constant, a variable,
  what a rewrite made the global batch's); None when no rewrite is active
  (the towers' kinds are unknown)."""
  rewrite = current()
  if rewrite is None:
    return None
  if not isinstance(tensor, tf.Tensor):
    return True
  return rewrite.kind_of(tensor).is_uniform


def share_of_global(value: tf.Tensor) -> tf.Tensor:
  """A value the same in every tower (one device's) as this tower's term of
  the towers' combination Σᵢ wᵢ·xᵢ, so it counts once: itself under "mean"
  (Σᵢ wᵢ = 1), times the tower's share of the examples nᵢ/n under "sum"
  (wᵢ = 1)."""
  rewrite = current()
  if rewrite is None or rewrite.share_kind != K.SUM:
    return value
  return tf.math.multiply_no_nan(value, tf.cast(rewrite.share, value.dtype))


def kind_of(tensor) -> Optional[str]:
  """The kind (`kinds.Kind`'s repr: "rows@0", "local", "mean", ...) the
  tower being built gave `tensor`; None without a rewrite."""
  rewrite = current()
  if rewrite is None or not isinstance(tensor, tf.Tensor):
    return None
  return repr(rewrite.kind_of(tensor))


def readout_kind(tensor):
  """What the tower being built knows `tensor` is, for a readout: "rows"
  (per example along axis 0, or rows counted by their values), "mean" or
  "sum" (a statistic of the shard, combined so), "uniform" (the same in
  every tower); None without a rewrite, or for rows along another axis."""
  rewrite = current()
  if rewrite is None or not isinstance(tensor, tf.Tensor) or (
      tensor.graph is not rewrite.graph):
    return None
  kind = rewrite.kind_of(tensor)
  if kind.is_local or (kind.is_rows and kind.axis == 0):
    return "rows"
  return kind.name if kind.is_statistic or kind.is_uniform else None


def tower_loss(loss):
  """`loss` as the towers' combination counts it, inside a tower being
  rewritten (`rewrite.TowerRewrite.tower_loss`); else `loss`."""
  rewrite = current()
  if rewrite is None or not isinstance(loss, tf.Tensor) or (
      loss.graph is not rewrite.graph):
    return loss
  return rewrite.tower_loss(loss)
