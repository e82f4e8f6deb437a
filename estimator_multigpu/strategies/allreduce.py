"""All-reduce: every tower gets the sum of the towers' gradients.

`all_reduce` takes, per tower, one gradient per variable and returns, per
tower, the sums, each placed on that tower's device, with bit-identical values
in every tower (so replicated copies stay equal). Two algorithms:

- "collective": TensorFlow's collective ops in graph mode
  (`CollectiveReduceV2`, `CollectiveGatherV2`); NCCL when every tower is a
  GPU, a ring over the host otherwise. Each tower's collectives are chained
  by control dependencies so every device launches them in the same order
  (NCCL deadlocks otherwise): last variable first, the order in which the
  backward pass produces gradients, so reductions overlap it.
- "add_n": the towers' gradients are summed once on the aggregation device
  and every tower reads that one sum (tf_cnn_benchmarks' `pscpu`/`psgpu`
  all-reduce specs). Also the fallback for dtypes the collectives lack.

`IndexedSlices` stay sparse: their values and indices are gathered (a padded
all-gather with "collective", a concatenation with "add_n"), never
densified. With `packing_bytes`, dense gradients of one dtype are flattened
and concatenated into buffers of at most that many bytes before the reduce
and split back after (tf_cnn_benchmarks' `--gradient_repacking`, Horovod's
tensor fusion): fewer, larger collectives.
"""

from __future__ import annotations

import weakref
from typing import Optional, Sequence

import tensorflow as tf

from estimator_multigpu import compat

collective_ops = compat.internal("collective_ops")


tf1 = tf.compat.v1

ALGORITHMS = ("collective", "add_n")
_COLLECTIVE_DTYPES = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)
_KEYS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class _Keys:
  """Collective group and instance keys, unique within one graph."""

  def __init__(self):
    self.groups: dict = {}
    self.next_instance = 1

  def group(self, devices: tuple) -> int:
    return self.groups.setdefault(devices, len(self.groups) + 1)

  def instance(self) -> int:
    self.next_instance += 1
    return self.next_instance - 1


def _keys() -> _Keys:
  graph = tf1.get_default_graph()
  if graph not in _KEYS:
    _KEYS[graph] = _Keys()
  return _KEYS[graph]


class _Collectives:
  """Issues collective ops over one group of devices, in a fixed order."""

  def __init__(self, devices: Sequence[str], group_size: int):
    self.devices = list(devices)
    self.group_size = group_size
    self.group_key = _keys().group(tuple(self.devices))
    self.hint = ("nccl" if all("GPU" in d.upper() for d in self.devices)
                 else "ring")
    self._last = [None] * len(self.devices)  # per device, its last output.

  def _run(self, tensors: list, make) -> list:
    instance_key = _keys().instance()
    outputs = []
    for index, (device, tensor) in enumerate(zip(self.devices, tensors)):
      after = [] if self._last[index] is None else [self._last[index]]
      with tf.device(device), tf.control_dependencies(after):
        outputs.append(make(tensor, instance_key))
      self._last[index] = outputs[-1]
    return outputs

  def sum(self, tensors: list) -> list:
    return self._run(tensors, lambda t, key: collective_ops.all_reduce_v2(
        t, group_size=self.group_size, group_key=self.group_key,
        instance_key=key, merge_op="Add", final_op="Id",
        communication_hint=self.hint))

  def gather(self, tensors: list) -> list:
    return self._run(tensors, lambda t, key: collective_ops.all_gather_v2(
        t, group_size=self.group_size, group_key=self.group_key,
        instance_key=key, communication_hint=self.hint))


def all_reduce(tower_grads: list, variables: list, devices: Sequence[str],
               algorithm: str = "collective", packing_bytes: int = 0,
               aggregation_device: Optional[str] = None,
               group_size: Optional[int] = None) -> list:
  """Sums each variable's gradient over the towers; every tower gets the sum.

  Args:
    tower_grads: per tower, one gradient per variable (a dense tensor,
      `IndexedSlices` or None), in the order of `variables`.
    variables: the variables (tower 0's), for shapes of missing gradients.
    devices: each tower's device, distinct.
    algorithm: "collective" or "add_n" (see the module docstring).
    packing_bytes: > 0 packs dense gradients into buffers of at most this
      many bytes before reducing; 0 reduces each gradient on its own.
    aggregation_device: where "add_n" sums.
    group_size: the towers of the whole collective group, when it spans
      other processes' towers too (an all-reduce cluster); default: these.

  Returns:
    Per tower, one summed gradient per variable: None where every tower's
    was None (a tower's None counts as zero otherwise), `IndexedSlices`
    where every tower's gradient was.
  """
  num_towers = len(devices)
  columns = [_normalize([grads[k] for grads in tower_grads], variable, devices)
             for k, variable in enumerate(variables)]
  results = [[None] * len(variables) for _ in range(num_towers)]
  group_size = group_size or num_towers
  collectives = (_Collectives(devices, group_size)
                 if algorithm == "collective" and group_size > 1 else None)
  ready_first = list(reversed(range(len(columns))))  # backward-pass order.
  dense = [k for k in ready_first if columns[k] is not None and
           not isinstance(columns[k][0], tf.IndexedSlices)]
  for keys, packed in _buckets(columns, dense, packing_bytes,
                                  devices):
    summed = _sum_dense(packed, collectives, aggregation_device, devices)
    for tower, pieces in enumerate(_unpack(summed, [columns[k] for k in keys],
                                           devices)):
      for k, piece in zip(keys, pieces):
        results[tower][k] = piece
  for k in ready_first:
    column = columns[k]
    if column is not None and isinstance(column[0], tf.IndexedSlices):
      for tower, piece in enumerate(_sum_sparse(column, collectives,
                                                aggregation_device, devices)):
        results[tower][k] = piece
  return results


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


def _unpack(summed: list, columns: list, devices) -> list:
  """Per tower, the summed buffer split back into the gradients' shapes."""
  if len(columns) == 1:
    return [[s] for s in summed]
  shapes = [column[0].shape for column in columns]
  unpacked = []
  for tower, buffer in enumerate(summed):
    with tf.device(devices[tower]), tf.name_scope("unpack"):
      pieces = tf.split(buffer, [s.num_elements() for s in shapes])
      unpacked.append([tf.reshape(p, s) for p, s in zip(pieces, shapes)])
  return unpacked


def _sum_dense(tensors: list, collectives, aggregation_device, devices):
  if len(tensors) == 1 and collectives is None:
    return tensors
  if collectives is not None and tensors[0].dtype in _COLLECTIVE_DTYPES:
    return collectives.sum(tensors)
  with tf.device(aggregation_device or devices[0]):
    total = tf.math.add_n(tensors)
  return [total] * len(tensors)


def _sum_sparse(slices: list, collectives, aggregation_device,
                devices) -> list:
  """Every tower's values and indices, concatenated in rank order."""
  if len(slices) == 1 and collectives is None:
    return slices
  if collectives is None or slices[0].values.dtype not in _COLLECTIVE_DTYPES:
    with tf.device(aggregation_device or devices[0]):
      total = tf.IndexedSlices(tf.concat([s.values for s in slices], 0),
                               tf.concat([s.indices for s in slices], 0),
                               slices[0].dense_shape)
    return [total] * len(slices)
  counts = collectives.gather([tf.shape(s.indices, out_type=tf.int32)[:1]
                               for s in slices])
  padded_values, padded_indices, masks = [], [], []
  for s, count, device in zip(slices, counts, devices):
    with tf.device(device):
      longest = tf.reduce_max(count)
      pad = longest - tf.shape(s.indices, out_type=tf.int32)[0]
      padded_values.append(tf.pad(
          s.values, [[0, pad]] + [[0, 0]] * (s.values.shape.rank - 1)))
      padded_indices.append(tf.pad(tf.cast(s.indices, tf.int64), [[0, pad]]))
      masks.append(tf.reshape(tf.sequence_mask(count, longest), [-1]))
  values = collectives.gather(padded_values)
  indices = collectives.gather(padded_indices)
  summed = []
  for s, v, i, mask, device in zip(slices, values, indices, masks, devices):
    with tf.device(device):
      summed.append(tf.IndexedSlices(
          tf.boolean_mask(v, mask),
          tf.cast(tf.boolean_mask(i, mask), s.indices.dtype), s.dense_shape))
  return summed
