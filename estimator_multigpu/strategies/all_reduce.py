"""All-reduce: every tower gets the sum of the towers' gradients.

`all_reduce` takes, per tower of this graph, one gradient per variable and
returns, per tower, the sums over the whole collective group (every task's
towers), each placed on that tower's device, with bit-identical values in
every tower (so replicated copies stay equal). The algorithms (`ALGORITHMS`,
tensorpack's 'nccl' / 'cpu' / 'hierarchical' modes):

- "collective": one collective over every tower of every task
  (`collectives.launch`: NCCL when every tower is a GPU, a ring otherwise).
- "add_n": the towers' gradients are summed once on the aggregation device
  and every tower reads that one sum (tf_cnn_benchmarks' `pscpu`/`psgpu`).
  One task only; also the fallback for dtypes the collectives lack.
- "hierarchical": summed within the task on its first tower, then across
  tasks once by that tower alone, and read back by the task's other towers:
  the bytes between tasks are one tower's, however many towers a task has.

Collectives go through the one collectives layer (`collectives`):
one key space, and one launch order on every device, last variable first
(the order in which the backward pass produces gradients). `IndexedSlices`
stay sparse: their values and indices are gathered (a padded all-gather),
never densified. With `packing_bytes` (`DEFAULT_PACKING_BYTES` unless the
user says otherwise), dense gradients of one dtype are flattened and
concatenated into buffers of at most that many bytes before the reduce and
split back after (tf_cnn_benchmarks' `--gradient_repacking`, Horovod's
tensor fusion): fewer, larger collectives.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import tensorflow as tf

from estimator_multigpu import collectives

tf1 = tf.compat.v1

# Horovod's fusion threshold: every gradient of a ResNet-50 fits in two.
DEFAULT_PACKING_BYTES = 64 << 20
_COLLECTIVE_DTYPES = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)


@dataclasses.dataclass(frozen=True)
class _Reduce:
  """Where the sums of one call are computed (see `all_reduce`)."""
  group: collectives.Group
  devices: list
  aggregation_device: Optional[str]

  @property
  def first(self) -> str:
    return self.aggregation_device or self.devices[0]


def all_reduce(tower_grads: list, variables: list, devices: Sequence[str],
               algorithm: str = "collective", packing_bytes: int = 0,
               aggregation_device: Optional[str] = None,
               group: Optional[collectives.Group] = None,
               carry: Optional[list] = None) -> tuple:
  """Sums each variable's gradient over the towers; every tower gets the sum.

  Args:
    tower_grads: per tower of this graph, one gradient per variable (a dense
      tensor, `IndexedSlices` or None), in the order of `variables`.
    variables: the variables (tower 0's), for shapes of missing gradients.
    devices: each of this graph's towers' device, distinct.
    algorithm: a name in `ALGORITHMS` (see the module docstring).
    packing_bytes: > 0 packs dense gradients into buffers of at most this
      many bytes before reducing; 0 reduces each gradient on its own.
    aggregation_device: where "add_n" sums.
    group: the collective group when it spans other tasks' towers too (an
      all-reduce cluster); default: these towers.
    carry: per tower, a scalar summed in the first dense buffer of its
      dtype (the loss, so that reporting it costs no collective of its own).

  Returns:
    (sums, carried). sums: per tower, one summed gradient per variable: None
    where every tower's was None (a tower's None counts as zero otherwise),
    `IndexedSlices` where every tower's gradient was. carried: the sum of
    `carry` over the group, or None (not given, or no buffer of its dtype).
  """
  columns = [_normalize([grads[k] for grads in tower_grads], variable, devices)
             for k, variable in enumerate(variables)]
  where = _Reduce(group or collectives.Group(tuple(devices)), list(devices),
                  aggregation_device)
  dense_sum, sparse_sum = ALGORITHMS[algorithm]
  results = [[None] * len(variables) for _ in devices]
  ready_first = list(reversed(range(len(columns))))  # backward-pass order.
  dense = [k for k in ready_first if columns[k] is not None and
           not isinstance(columns[k][0], tf.IndexedSlices)]
  carried = None
  for keys, packed in _buckets(columns, dense, packing_bytes, devices):
    bucket = [columns[k] for k in keys]
    if carry is not None and carried is None and (
        packed[0].dtype == carry[0].dtype):
      summed = dense_sum(_append(packed, carry, devices), where)
      with tf.device(devices[0]):
        carried = summed[0][-1]
      unpacked = _unpack_flat(summed, bucket, devices, carried=True)
    else:
      unpacked = _unpack(dense_sum(packed, where), bucket, devices)
    for tower, pieces in enumerate(unpacked):
      for k, piece in zip(keys, pieces):
        results[tower][k] = piece
  for k in ready_first:
    if columns[k] is not None and k not in dense:
      for tower, piece in enumerate(sparse_sum(columns[k], where)):
        results[tower][k] = piece
  return results, carried


def _normalize(column: list, variable, devices) -> Optional[list]:
  """One variable's gradients over towers, all dense or all IndexedSlices."""
  present = [g for g in column if g is not None]
  if not present:
    return None
  sparse = all(isinstance(g, tf.IndexedSlices) for g in present)
  normalized = []
  for grad, device in zip(column, devices):
    with tf.device(device):
      if grad is None and sparse:
        grad = tf.IndexedSlices(
            tf.zeros([0] + variable.shape.as_list()[1:], present[0].dtype),
            tf.zeros([0], present[0].indices.dtype), present[0].dense_shape)
      elif grad is None:
        grad = tf.zeros(variable.shape, present[0].dtype)
      elif not sparse:
        grad = tf.convert_to_tensor(grad)
    normalized.append(grad)
  return normalized


def _buckets(columns: list, dense: list, packing_bytes: int, devices):
  """Yields (variable positions, per-tower tensors to reduce together)."""
  if packing_bytes <= 0:
    for k in dense:
      yield [k], columns[k]
    return
  by_dtype: dict = {}
  for k in dense:
    by_dtype.setdefault(columns[k][0].dtype, []).append(k)
  for dtype, keys in by_dtype.items():
    bucket, size = [], 0
    for k in keys + [None]:
      nbytes = (0 if k is None else
                columns[k][0].shape.num_elements() * dtype.size)
      if bucket and (k is None or size + nbytes > packing_bytes):
        yield bucket, _pack([columns[j] for j in bucket], devices)
        bucket, size = [], 0
      if k is not None:
        bucket.append(k)
        size += nbytes


def _pack(columns: list, devices) -> list:
  """Per tower, its gradients flattened into one buffer (or the one tensor)."""
  if len(columns) == 1:
    return columns[0]
  packed = []
  for tower in range(len(columns[0])):
    pieces = [column[tower] for column in columns]
    with tf.device(devices[tower]), tf.name_scope("pack"):
      packed.append(tf.concat([tf.reshape(p, [-1]) for p in pieces], 0))
  return packed


def _append(packed: list, carry: list, devices) -> list:
  """Per tower, its buffer flattened with its carried scalar at the end."""
  appended = []
  for buffer, scalar, device in zip(packed, carry, devices):
    with tf.device(device), tf.name_scope("pack"):
      appended.append(tf.concat([tf.reshape(buffer, [-1]),
                                 tf.reshape(scalar, [1])], 0))
  return appended


def _unpack(summed: list, columns: list, devices) -> list:
  """Per tower, the summed buffer split back into the gradients' shapes."""
  if len(columns) == 1:
    return [[s] for s in summed]
  return _unpack_flat(summed, columns, devices)


def _unpack_flat(summed: list, columns: list, devices,
                 carried: bool = False) -> list:
  """Per tower, a flat summed buffer split into the gradients' shapes (the
  carried scalar at its end dropped)."""
  shapes = [column[0].shape for column in columns]
  sizes = [s.num_elements() for s in shapes] + ([1] if carried else [])
  unpacked = []
  for tower, buffer in enumerate(summed):
    with tf.device(devices[tower]), tf.name_scope("unpack"):
      pieces = tf.split(buffer, sizes)
      unpacked.append([tf.reshape(p, s) for p, s in zip(pieces, shapes)])
  return unpacked


def _collective_dense(tensors: list, where: _Reduce) -> list:
  """One collective over every tower of every task."""
  if where.group.num_towers == 1:
    return tensors
  if not _has_collective(tensors[0].dtype, where.group):
    return _add_n_dense(tensors, where)
  return collectives.launch(where.group, tensors)


def _add_n_dense(tensors: list, where: _Reduce) -> list:
  """One sum on the aggregation device that every tower reads."""
  if len(tensors) == 1:
    return tensors
  with tf.device(where.first):
    total = tf.math.add_n(tensors)
  return [total] * len(tensors)


def _hierarchical_dense(tensors: list, where: _Reduce) -> list:
  """Σ within the task on its first tower, across tasks once, read back."""
  local = _add_n_dense(tensors, dataclasses.replace(where,
                                                    aggregation_device=None))
  leaders = where.group.leaders()
  if leaders.num_towers == 1 or not _has_collective(local[0].dtype,
                                                     leaders):
    return local
  return collectives.launch(leaders, local[:1]) * len(tensors)


def _collective_sparse(slices: list, where: _Reduce) -> list:
  """Every tower of every task gathers every tower's rows."""
  if where.group.num_towers == 1:
    return slices
  if not _has_collective(slices[0].values.dtype, where.group):
    return _add_n_sparse(slices, where)
  return _gather_sparse(slices, where.group, where.devices)


def _add_n_sparse(slices: list, where: _Reduce) -> list:
  """The towers' rows, concatenated in tower order on one device."""
  if len(slices) == 1:
    return slices
  with tf.device(where.first):
    total = tf.IndexedSlices(tf.concat([s.values for s in slices], 0),
                             tf.concat([s.indices for s in slices], 0),
                             slices[0].dense_shape)
  return [total] * len(slices)


def _hierarchical_sparse(slices: list, where: _Reduce) -> list:
  """The task's rows concatenated, then gathered across tasks once."""
  local = _add_n_sparse(slices, dataclasses.replace(where,
                                                    aggregation_device=None))
  leaders = where.group.leaders()
  if leaders.num_towers == 1 or not _has_collective(local[0].values.dtype,
                                                     leaders):
    return local
  return _gather_sparse(local[:1], leaders, where.devices[:1]) * len(slices)


# Name -> (dense sum, sparse sum): a new algorithm is one entry.
ALGORITHMS: "dict[str, tuple[Callable, Callable]]" = {
    "collective": (_collective_dense, _collective_sparse),
    "add_n": (_add_n_dense, _add_n_sparse),
    "hierarchical": (_hierarchical_dense, _hierarchical_sparse),
}
# The algorithms whose sums reach other tasks' towers.
ACROSS_TASKS = ("collective", "hierarchical")


def _has_collective(dtype: tf.DType, group: collectives.Group) -> bool:
  """Whether collectives reduce `dtype`; across tasks they must.

  Raises:
    ValueError: a gradient of another dtype in a group spanning tasks,
      where one task's sum would silently miss the others'.
  """
  if dtype in _COLLECTIVE_DTYPES:
    return True
  if group.num_tasks > 1:
    raise ValueError(
        f"A gradient is {dtype.name}; all-reducing between tasks supports "
        f"{', '.join(d.name for d in _COLLECTIVE_DTYPES)}. Keep the "
        "variables in float32 (mixed_precision computes in the towers only).")
  return False


def _gather_sparse(slices: list, group: collectives.Group,
                   devices: list) -> list:
  """Every member's values and indices, concatenated in rank order."""
  counts = collectives.launch(
      group, [tf.shape(s.indices, out_type=tf.int32)[:1] for s in slices],
      "gather")
  padded_values, padded_indices, masks = [], [], []
  for s, count, device in zip(slices, counts, devices):
    with tf.device(device):
      longest = tf.reduce_max(count)
      pad = longest - tf.shape(s.indices, out_type=tf.int32)[0]
      padded_values.append(tf.pad(
          s.values, [[0, pad]] + [[0, 0]] * (s.values.shape.rank - 1)))
      padded_indices.append(tf.pad(tf.cast(s.indices, tf.int64), [[0, pad]]))
      masks.append(tf.reshape(tf.sequence_mask(count, longest), [-1]))
  values = collectives.launch(group, padded_values, "gather")
  indices = collectives.launch(group, padded_indices, "gather")
  summed = []
  for s, v, i, mask, device in zip(slices, values, indices, masks, devices):
    with tf.device(device):
      summed.append(tf.IndexedSlices(
          tf.boolean_mask(v, mask),
          tf.cast(tf.boolean_mask(i, mask), s.indices.dtype), s.dense_shape))
  return summed
