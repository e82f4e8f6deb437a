"""Clipping: the one clip of the update chain, and the warning for a clip
written inside the model_fn.

`clip_by_global_norm` is the chain's clip step (`multi_gpu(
clip_gradients_by_norm=...)`): it clips each optimizer call's combined
gradients, which cover the global batch, as one device would. A clip inside
the model_fn acts on one tower's gradient before the towers are combined;
`warn_if_clipped_by_global_norm` says so once.
"""

from __future__ import annotations

from absl import logging
import tensorflow as tf


def clip_by_global_norm(grads_and_vars: list, clip_norm: float) -> list:
  """Clips the gradients (None skipped) to a global norm of `clip_norm`."""
  present = [(g, v) for g, v in grads_and_vars if g is not None]
  clipped, _ = tf.clip_by_global_norm([g for g, _ in present], clip_norm)
  by_variable = {id(v): g for (_, v), g in zip(present, clipped)}
  return [(by_variable.get(id(v)), v) for _, v in grads_and_vars]


_CLIP_SCOPE = "clip_by_global_norm"
_WARNED: set = set()


def warn_if_clipped_by_global_norm(grads: list) -> bool:
  """Warns once when a tower's gradients come from `tf.clip_by_global_norm`.

  Returns:
    Whether the gradients look clipped by global norm (an output of the ops
    `tf.clip_by_global_norm` names after itself, as Google BERT's
    `optimization.py` and `tf_slim.optimize_loss(clip_gradients=...)` use).
  """
  clipped = any(_CLIP_SCOPE in _producer_name(g) for g in grads
                if g is not None)
  if clipped and _CLIP_SCOPE not in _WARNED:
    _WARNED.add(_CLIP_SCOPE)
    logging.warning(
        "multi_gpu: the model_fn clips its gradients by global norm "
        "(tf.clip_by_global_norm) inside each tower, so each tower's own "
        "gradient is clipped before the towers are combined; one device "
        "clips the gradient of the whole batch. To clip exactly as on one "
        "device, remove the clip from the model_fn and pass "
        "multi_gpu(..., clip_gradients_by_norm=<the same norm>).")
  return clipped




def _producer_name(grad) -> str:
  values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
  return getattr(getattr(values, "op", None), "name", "")
