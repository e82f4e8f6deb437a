"""Predictions whose other dimensions differ between towers, padded.

A prediction's non-batch dimensions may depend on the shard: greedy decoding
stops at the shard's longest sequence, a detector keeps as many boxes as the
shard's busiest image. One device's batch is padded to the longest of the
whole batch, which is the largest over the towers. So before the towers'
predictions are joined along axis 0, every axis ≥ 1 that may differ (not
the same static size in every tower) is padded at its end to the largest
across towers, with the `prediction_pad_value` option of `multi_gpu`:

- None (default): 0 for numbers, False for booleans, "" for strings;
- one value for every padded prediction (it must fit the prediction's
  dtype: a string for strings, an integer for integer predictions);
- a dict `{prediction key: value}`; keys it does not name get the default.

Each example's own positions are then one device's; positions past the
example's own end hold what the model_fn wrote there up to its tower's
longest, and the pad value past that.
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

PadValue = Any  # None, a number, a bool, a str/bytes, or a dict of those.
_SCALARS = (int, float, bool, str, bytes)


def check_pad_value(value: PadValue) -> PadValue:
  """`prediction_pad_value` as given, checked when the model_fn is wrapped.

  Raises:
    TypeError: not None, a number, bool or string, or a dict of those keyed
      by prediction keys (strings).
  """
  entries = value.items() if isinstance(value, dict) else [("", value)]
  for key, entry in entries:
    if (not isinstance(key, str) or
        (entry is not None and not isinstance(entry, _SCALARS))):
      raise TypeError(
          f"`prediction_pad_value` is {value!r}; expected None (0 for "
          "numbers, False for booleans, '' for strings), one number, bool "
          "or string for every prediction, or a dict of those keyed by "
          "prediction key, e.g. prediction_pad_value={'ids': -1}.")
  return value


def pad_value_for(option: PadValue, key: Optional[str]) -> Any:
  """The option's value for prediction `key` (None: the dtype's default)."""
  if isinstance(option, dict):
    return option.get(key)
  return option


def pad_to_largest(pieces: list, pad_value: Any, name: str) -> list:
  """The towers' `pieces`, each padded on every axis ≥ 1 that may differ
  to the largest across towers (unchanged when a rank is unknown: then
  they are joined as they are).

  Raises:
    ValueError: the pieces' ranks differ, or `pad_value` does not fit their
      dtype (the message names the prediction).
  """
  rank = _common_rank(pieces, name)
  axes = [axis for axis in range(1, rank or 0) if _may_differ(pieces, axis)]
  if not axes:
    return pieces
  with tf.name_scope("pad_to_largest"):
    value = _pad_constant(pieces[0].dtype, pad_value, name)
    shapes = [tf.shape(piece, out_type=tf.int64) for piece in pieces]
    largest = tf.reduce_max(tf.stack(shapes), axis=0)
    return [_padded(piece, shape, largest, axes, value)
            for piece, shape in zip(pieces, shapes)]


def _padded(piece, shape, largest, axes, value):
  extra = largest - shape
  zero = tf.zeros([], tf.int64)
  paddings = tf.stack([[zero, extra[axis] if axis in axes else zero]
                       for axis in range(piece.shape.rank)])
  return tf.pad(piece, paddings, constant_values=value)


def _common_rank(pieces: list, name: str) -> Optional[int]:
  """The pieces' rank; None when some rank is unknown."""
  ranks = [piece.shape.rank for piece in pieces]
  known = {rank for rank in ranks if rank is not None}
  if len(known) > 1:
    raise ValueError(
        f"The model_fn's `{name}` has ranks {ranks} in towers 0.. (None: "
        "unknown); `multi_gpu` joins the towers' predictions along axis 0 "
        "and pads other axes that differ, so each must have the same rank in "
        "every tower.")
  return None if None in ranks else ranks[0]


def _may_differ(pieces: list, axis: int) -> bool:
  sizes = {piece.shape[axis] for piece in pieces}
  return None in sizes or len(sizes) > 1


def _pad_constant(dtype: tf.DType, pad_value: Any, name: str) -> tf.Tensor:
  """`pad_value` (or the dtype's default) as a scalar of `dtype`."""
  if pad_value is None:
    pad_value = "" if dtype == tf.string else (
        False if dtype == tf.bool else 0)
  fits = (isinstance(pad_value, (str, bytes)) if dtype == tf.string else
          isinstance(pad_value, bool) if dtype == tf.bool else
          not isinstance(pad_value, (str, bytes)) and (
              dtype.is_floating or dtype.is_complex or
              float(pad_value).is_integer()))
  if not fits:
    raise ValueError(
        f"`prediction_pad_value` {pad_value!r} does not fit the model_fn's "
        f"`{name}` ({dtype.name}), which differs in size between towers and "
        "is padded to the largest; pass a value of its kind, e.g. "
        "prediction_pad_value={'<key>': -1} (or '' for strings).")
  if dtype.is_integer:  # -1.0 pads int32 classes as -1.
    pad_value = int(pad_value)
  return tf.constant(pad_value, dtype)
