"""Splitting: cut a global batch into one contiguous shard per tower.

Shards are taken along axis 0, in order, with sizes that differ by at most one
(the first `n % num_towers` towers get one extra example). Any batch size
works: unknown until run time, not divisible by the tower count, or smaller
than it (some shards are then empty). Features and labels may be tensors,
`SparseTensor`s, or nested dicts/tuples/lists of them. Features that are not
batch-major (a vocabulary, a lookup table) can be named `unsplit`: every
tower then gets them whole. `RaggedTensor`s are refused with a clear error.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence, Union

import tensorflow as tf

BatchSize = Union[int, tf.Tensor]


@dataclasses.dataclass(frozen=True)
class Split:
  """A global batch cut into shards.

  Attributes:
    shards: per tower, a `(features, labels)` pair with the input structure.
    sizes: per tower, the shard's number of examples (ints when the global
      batch size is known when the graph is built, else scalar int32 tensors).
    global_batch_size: the number of examples in the global batch.
  """
  shards: list
  sizes: list
  global_batch_size: BatchSize

  @property
  def static(self) -> bool:
    """Whether the shard sizes are known when the graph is built."""
    return isinstance(self.global_batch_size, int)

  def may_be_empty(self, index: int) -> bool:
    """Whether tower `index`'s shard is, or may be at run time, empty (tower
    0's only when the global batch is)."""
    if self.static:
      return self.sizes[index] == 0
    return index > 0

  def loss_weight(self, index: int, loss_reduction: str, total: Any = None):
    """What tower `index`'s loss (and gradients) are scaled by.

    nᵢ / n for "mean", 1 for "sum", and 0 for an empty shard either way, so
    the "mean" weights sum to 1 whenever the global batch is not empty.
    A float when the sizes are static, else a scalar float32 tensor. `total`:
    n, when the global batch is more than this split's (every task's batch
    of an all-reduce cluster); default `global_batch_size`.
    """
    size = self.sizes[index]
    total = self.global_batch_size if total is None else total
    if self.static and isinstance(total, int):
      if loss_reduction == "sum":
        return 1.0 if size > 0 else 0.0
      return size / total if total else 0.0
    if loss_reduction == "sum":
      return tf.cast(size > 0, tf.float32)
    return tf.math.divide_no_nan(tf.cast(size, tf.float32),
                                 tf.cast(total, tf.float32))


def leaves_with_paths(structure: Any, prefix: str) -> list[tuple[str, Any]]:
  """Flattens a nested structure into `(path, leaf)` pairs, like tf.nest."""
  if isinstance(structure, dict):
    return [pair for key in sorted(structure)
            for pair in leaves_with_paths(structure[key], f"{prefix}[{key!r}]")]
  if isinstance(structure, (list, tuple)):
    return [pair for i, item in enumerate(structure)
            for pair in leaves_with_paths(item, f"{prefix}[{i}]")]
  return [(prefix, structure)]


def shard_sizes(global_batch_size: BatchSize, num_towers: int) -> list:
  """Sizes of the towers' shards: n // k, plus one for the first n % k."""
  if isinstance(global_batch_size, int):
    base, extra = divmod(global_batch_size, num_towers)
    return [base + (1 if i < extra else 0) for i in range(num_towers)]
  base = global_batch_size // num_towers
  extra = global_batch_size % num_towers
  return [base + tf.cast(i < extra, tf.int32) for i in range(num_towers)]


def split_batch(features: Any, labels: Any, num_towers: int,
                unsplit: Sequence[str] = (),
                require_examples: bool = False) -> Split:
  """Cuts `features` and `labels` into `num_towers` contiguous shards.

  Args:
    features: a tensor, `SparseTensor` or nested structure of them.
    labels: the same kinds, or None.
    num_towers: how many shards to make.
    unsplit: keys of the `features` dict that every tower gets whole.
    require_examples: fail at run time when the global batch is empty (as in
      TRAIN and EVAL, where one device's loss would be NaN).

  Returns:
    A `Split`.

  Raises:
    TypeError: an input is a `RaggedTensor`, or `unsplit` is given but
      `features` is not a dict.
    ValueError: an input has no batch dimension, the inputs disagree on the
      batch size when the graph is built, `unsplit` names a missing key, or
      the global batch is known to be empty and `require_examples` is set.
  """
  given = features
  features, whole = _take_unsplit(features, unsplit)
  leaves = (leaves_with_paths(features, "features") +
            leaves_with_paths(labels, "labels"))
  leaves = [(path, leaf) for path, leaf in leaves if leaf is not None]
  with tf.name_scope("split_batch"), tf.device("/device:CPU:0"):
    global_batch_size, checks = _global_batch_size(leaves)
    if require_examples:
      checks.extend(_check_not_empty(global_batch_size))
    sizes = shard_sizes(global_batch_size, num_towers)
    with tf.control_dependencies(checks):
      cut = [_split_leaf(leaf, sizes) for _, leaf in leaves]
  shards = []
  for i in range(num_towers):
    tower_leaves = iter(pieces[i] for pieces in cut)
    shards.append((_put_back(given, _pack(features, tower_leaves), whole),
                   _pack(labels, tower_leaves)))
  return Split(shards, sizes, global_batch_size)


def _take_unsplit(features: Any, unsplit: Sequence[str]) -> tuple:
  """`features` without the `unsplit` keys, and those keys' values."""
  if not unsplit:
    return features, {}
  if not isinstance(features, dict):
    raise TypeError(
        f"`unsplit_features`={list(unsplit)} names feature keys, but the "
        f"features are a {type(features).__name__}, not a dict. Return a "
        "dict of features from the input_fn, or drop `unsplit_features`.")
  absent = [key for key in unsplit if key not in features]
  if absent:
    raise ValueError(
        f"`unsplit_features` names {absent}, which the features do not have; "
        f"they have {sorted(features)}. Fix the names.")
  rest = {k: v for k, v in features.items() if k not in unsplit}
  return type(features)(rest), {k: features[k] for k in unsplit}


_EMPTY_BATCH = (
    "The global batch has no examples. On one device the loss of an empty "
    "batch is NaN; `multi_gpu` stops instead of training or evaluating on "
    "nothing. Make the input_fn yield non-empty batches (e.g. "
    "`Dataset.batch(n, drop_remainder=True)` or filter empty ones).")


def _check_not_empty(global_batch_size: BatchSize) -> list:
  if isinstance(global_batch_size, int):
    if global_batch_size == 0:
      raise ValueError(_EMPTY_BATCH)
    return []
  return [tf.debugging.assert_positive(global_batch_size,
                                       message=_EMPTY_BATCH)]


def _batch_dim(path: str, leaf: Any) -> BatchSize:
  """The leaf's batch size: an int if static, else a scalar tensor."""
  if isinstance(leaf, tf.RaggedTensor):
    raise TypeError(
        f"`{path}` is a tf.RaggedTensor; `multi_gpu` cuts tensors and "
        "SparseTensors along axis 0, not ragged ones. Convert it in the "
        "input_fn with `.to_tensor()` (padded) or `.to_sparse()`, or pass it "
        "whole to every tower with `unsplit_features`.")
  if isinstance(leaf, tf.SparseTensor):
    static = tf.get_static_value(leaf.dense_shape)
    return int(static[0]) if static is not None else tf.cast(
        leaf.dense_shape[0], tf.int32)
  leaf = tf.convert_to_tensor(leaf)
  if leaf.shape.rank == 0:
    raise ValueError(
        f"`{path}` is a scalar, but every input to `multi_gpu` must have a "
        "batch dimension (axis 0) to split across towers. Batch it, e.g. "
        "with `tf.data.Dataset.batch`, or give it shape [batch_size, ...].")
  static = leaf.shape[0] if leaf.shape.rank is not None else None
  return int(static) if static is not None else tf.shape(leaf)[0]


def _global_batch_size(leaves: list) -> tuple[BatchSize, list]:
  """Returns the agreed batch size and run-time checks for unknown ones."""
  if not leaves:
    raise ValueError("`multi_gpu` got no features to split; expected at least "
                     "one tensor with a batch dimension.")
  dims = [(path, _batch_dim(path, leaf)) for path, leaf in leaves]
  static = [(path, dim) for path, dim in dims if isinstance(dim, int)]
  for path, dim in static[1:]:
    if dim != static[0][1]:
      raise ValueError(
          f"Inputs disagree on the batch size: `{static[0][0]}` has "
          f"{static[0][1]} examples but `{path}` has {dim}. All features and "
          "labels must have the same size along axis 0; fix the input_fn, or "
          "name features that are not batch-major (a vocabulary) in "
          "`multi_gpu(unsplit_features=...)` to give every tower them whole.")
  if static:
    reference_path, reference = static[0]
  else:
    reference_path, reference = dims[0]
  checks = [_assert_same_batch(path, dim, reference_path, reference)
            for path, dim in dims if not isinstance(dim, int)]
  return reference, checks


def _assert_same_batch(path, dim, reference_path, reference):
  return tf.debugging.assert_equal(
      dim, reference, message=(
          f"Inputs disagree on the batch size: `{path}` and "
          f"`{reference_path}` must have the same size along axis 0 "
          "(their sizes follow); fix the input_fn."))


def _split_leaf(leaf: Any, sizes: list) -> list:
  if isinstance(leaf, tf.SparseTensor):
    return _split_sparse(leaf, sizes)
  leaf = tf.convert_to_tensor(leaf)
  if all(isinstance(size, int) for size in sizes):
    return tf.split(leaf, sizes, axis=0, num=len(sizes))
  return tf.split(leaf, tf.stack(sizes), axis=0, num=len(sizes))


def _split_sparse(leaf: tf.SparseTensor, sizes: list) -> list:
  """Cuts a SparseTensor into row blocks; indices restart at 0 in each."""
  pieces, start = [], 0
  rest = tf.cast(leaf.dense_shape[1:], tf.int64)
  for size in sizes:
    start_vector = tf.concat([[tf.cast(start, tf.int64)],
                              tf.zeros_like(rest)], axis=0)
    size_vector = tf.concat([[tf.cast(size, tf.int64)], rest], axis=0)
    pieces.append(tf.sparse.slice(leaf, start_vector, size_vector))
    start = start + size
  return pieces


def _pack(structure: Any, leaves_iter) -> Any:
  """Rebuilds `structure` (as flattened by `leaves_with_paths`)."""
  if structure is None:
    return None
  if isinstance(structure, dict):
    packed = {key: _pack(structure[key], leaves_iter)
              for key in sorted(structure)}
    return type(structure)((key, packed[key]) for key in structure)
  if isinstance(structure, (list, tuple)):
    items = [_pack(item, leaves_iter) for item in structure]
    if hasattr(structure, "_fields"):
      return type(structure)(*items)
    return type(structure)(items)
  return next(leaves_iter)


def _put_back(original: Any, shard: Any, whole: dict) -> Any:
  """`shard` with the unsplit entries back, in `original`'s key order."""
  if not whole:
    return shard
  return type(original)((key, whole[key] if key in whole else shard[key])
                        for key in original)
