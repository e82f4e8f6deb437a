"""The one collectives layer: groups, keys and launch order for every
collective the package builds.

A `Group` is every tower of a step: tasks × local towers (one task without
a cluster). Two kinds of callers use it, with one key space per graph:

- `launch` (the gradient all-reduce, `strategies.all_reduce`): one collective
  issued on all of this graph's towers at once, chained after the previous
  `launch` on each device, so every device starts them in the same order
  (NCCL deadlocks otherwise).
- `all_reduce_sum` (sync batch norm, `cross_tower_*`, moments, the sums over
  tasks): a differentiable sum issued tower by tower inside the forward
  pass, wrapped in `tf.custom_gradient` (the backward pass is another
  all-reduce).

Both run TensorFlow's own collective ops (`CollectiveReduceV2`,
`CollectiveGatherV2`: in-process transport between the CPU devices of one
session, a ring between tasks, NCCL between GPUs).

Keys. A collective is matched across devices by its group key (the set of
towers) and instance key (one call). The k-th `all_reduce_sum` of every tower
shares one forward instance key; the j-th gradient of that call shares one
backward key. Every key comes from one process-wide counter, so graphs built
one after another in a process (Estimator's train, eval and export graphs)
never share keys, and each layer of each graph has its own.

Never a hang. A collective waits for every tower of its group, so the towers
must build the same calls and run them in the same `session.run`
(`multi_gpu`'s merged train_op and loss reach every tower). `check_complete`
turns a tower that built fewer collectives into a build-time error, and every
collective carries `TIMEOUT_SECONDS`: a step that reaches only some towers
fails with `DeadlineExceededError` naming the `cross_tower_all_reduce` op
(the session's collectives stay aborted afterwards; restart the program).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
from typing import Any, Optional
import weakref

import tensorflow as tf

from estimator_multigpu import compat

collective_ops = compat.internal("collective_ops")
tf1 = tf.compat.v1

# How long a collective waits for the other towers before failing the step.
TIMEOUT_SECONDS = 600.0

_KEYS = itertools.count(start=1001)
_LOCK = threading.RLock()
_GRAPH_KEYS: "weakref.WeakKeyDictionary[tf.Graph, GraphKeys]" = (
    weakref.WeakKeyDictionary())


@dataclasses.dataclass(frozen=True)
class Group:
  """The towers taking part in each all-reduce.

  Attributes:
    devices: the towers' devices, in tower order (the collective's group).
    timeout: seconds a collective waits for the others; 0 waits forever.
    communication_hint: "auto", "ring" or "nccl". Keep "auto": v1 sessions
      do not order collectives, and NCCL needs one launch order on all GPUs.
    first_local: the first of the towers this graph builds; with
      `local_towers`, for a group that spans other processes' towers too.
    local_towers: how many of the towers this graph builds (0: all).
  """
  devices: tuple
  timeout: float = TIMEOUT_SECONDS
  communication_hint: str = "auto"
  first_local: int = 0
  local_towers: int = 0

  @property
  def num_towers(self) -> int:
    return len(self.devices)

  @property
  def num_local(self) -> int:
    """How many of the towers this graph builds (one task's)."""
    return self.local_towers or self.num_towers

  @property
  def num_tasks(self) -> int:
    return self.num_towers // self.num_local

  @property
  def local_devices(self) -> tuple:
    """The devices of the towers this graph builds, in tower order."""
    return self.devices[self.first_local:self.first_local + self.num_local]

  def leaders(self) -> "Group":
    """One member per task, its first tower: for what crosses tasks once."""
    task = self.first_local // self.num_local
    return dataclasses.replace(
        self, devices=self.devices[::self.num_local], first_local=task,
        local_towers=1)

  @property
  def launch_hint(self) -> str:
    """NCCL when every tower is a GPU, a ring otherwise (`launch`)."""
    return ("nccl" if all("GPU" in d.upper() for d in self.devices)
            else "ring")

  @property
  def last_local(self) -> int:
    """The index of the last tower this graph builds."""
    return self.first_local + (self.local_towers or self.num_towers) - 1


class GraphKeys:
  """The collective keys of one graph, and how many towers used each."""

  def __init__(self):
    self.group_keys: dict = {}
    self.forward_keys: dict = {}  # group devices -> keys by call position.
    self.calls: collections.Counter = collections.Counter()
    self.backward_keys: dict = {}
    self.participants: collections.Counter = collections.Counter()
    self.expected: dict = {}
    self.launched: dict = {}  # device -> the last `launch` output there.
    self.rows_slots: dict = {}  # instance key -> `rows_slot`.

  def group_key(self, group: Group) -> int:
    if group.devices not in self.group_keys:
      self.group_keys[group.devices] = next(_KEYS)
    return self.group_keys[group.devices]

  def forward_key(self, group: Group, tower_index: int) -> int:
    """The key of this tower's next forward call (shared across towers)."""
    position = self._count((group.devices, tower_index))
    keys = self.forward_keys.setdefault(group.devices, [])
    while len(keys) <= position:
      keys.append(next(_KEYS))
    return self._use(keys[position], group)

  def backward_key(self, forward_key: int, tower_index: int,
                   group: Group) -> int:
    """The key of this tower's next gradient of the `forward_key` call."""
    position = self._count((forward_key, tower_index))
    if (forward_key, position) not in self.backward_keys:
      self.backward_keys[(forward_key, position)] = next(_KEYS)
    return self._use(self.backward_keys[(forward_key, position)], group)

  def rows_slot(self, instance_key: int) -> int:
    """The place of `instance_key` among the graph's collectives whose
    rows vary from step to step (the same in every tower and task)."""
    if instance_key not in self.rows_slots:
      if len(self.rows_slots) >= _ROWS_SLOTS:
        raise ValueError(
            f"More than {_ROWS_SLOTS} cross-tower collectives of tensors "
            "whose rows vary between steps in one graph; join fewer tensors "
            "(concatenate them along axis 1 before `cross_tower_concat`).")
      self.rows_slots[instance_key] = len(self.rows_slots)
    return self.rows_slots[instance_key]

  def instance_key(self) -> int:
    """A fresh key for a collective every tower issues at once (`launch`)."""
    return next(_KEYS)

  def _count(self, slot) -> int:
    self.calls[slot] += 1
    return self.calls[slot] - 1

  def _use(self, key: int, group: Group) -> int:
    self.participants[key] += 1
    self.expected[key] = group.local_towers or group.num_towers
    return key

  def incomplete(self) -> dict:
    """{instance key: (towers that built it, towers expected)} if short."""
    return {key: (count, self.expected[key])
            for key, count in self.participants.items()
            if count != self.expected[key]}


def graph_keys(graph: Optional[tf.Graph] = None) -> GraphKeys:
  """The keys of `graph` (default: the default graph); a function body's
  (a `tf.cond` branch, a `tf.while_loop` body, a gradient of one) are its
  outermost graph's: one sequence of keys, so a collective built in a body
  never reuses a key of the graph around it."""
  graph = graph or tf1.get_default_graph()
  while getattr(graph, "outer_graph", None) is not None:
    graph = graph.outer_graph
  with _LOCK:
    if graph not in _GRAPH_KEYS:
      _GRAPH_KEYS[graph] = GraphKeys()
    return _GRAPH_KEYS[graph]


def check_complete(graph: Optional[tf.Graph] = None) -> None:
  """Raises if some tower built fewer all-reduces than the others.

  Such a collective would wait forever for the missing towers.

  Raises:
    ValueError: names the keys and how many towers built each.
  """
  short = graph_keys(graph).incomplete()
  if short:
    details = ", ".join(f"key {key}: {count} of {expected} towers"
                        for key, (count, expected) in sorted(short.items()))
    raise ValueError(
        "The towers built different cross-tower reductions "
        f"({details}); a step would wait forever for the missing towers. "
        "Every tower must build the same batch-norm layers in training mode "
        "(synchronized batch norm) and make the same global_ratio, "
        "cross_tower_sum and cross_tower_concat calls, in the same order, and "
        "compute gradients through them the same way.")


def all_reduce_sum(value: tf.Tensor, group: Group, tower_index: int,
                   device: str, weight: Any = None) -> tf.Tensor:
  """Σ over the towers of `value`, on `device`; differentiable.

  Args:
    value: this tower's tensor; same shape and dtype in every tower.
    group: the towers.
    tower_index: this tower's position in `group.devices`.
    device: where this tower's collective runs.
    weight: this tower's share of the global batch (wᵢ), which
      `TowerOptimizer.apply_gradients` multiplies the tower's gradients by
      after they are computed, whichever way (`compute_gradients`,
      `tf.gradients`). None: 1.

  Returns:
    The sum. Its gradient in tower i is (Σⱼ wⱼ·gⱼ) / wᵢ for the towers'
    upstream gradients gⱼ, so that after the multiplication by wᵢ each
    tower's loss counts with its share (0 for an empty shard, whose inputs
    get no gradient anyway).
  """
  keys = graph_keys()
  forward_key = keys.forward_key(group, tower_index)

  @tf.custom_gradient
  def summed(vector):
    def grad(upstream):
      # d(Σⱼ vⱼ)/dvᵢ = I, and tower j's copy of the sum feeds only tower
      # j's loss: tower i's gradient is Σⱼ of the towers' upstream
      # gradients.
      key = keys.backward_key(forward_key, tower_index, group)
      scale = weight
      if scale is None or (isinstance(scale, float) and scale == 1.0):
        return _reduce(upstream, group, key, device)
      scale = tf.cast(scale, upstream.dtype)
      return tf.math.divide_no_nan(
          _reduce(upstream * scale, group, key, device), scale)
    return _reduce(vector, group, forward_key, device), grad

  return summed(value)


def _reduce(value: tf.Tensor, group: Group, instance_key: int,
            device: str) -> tf.Tensor:
  with tf.device(device):
    return collective_ops.all_reduce_v2(
        value, group_size=group.num_towers,
        group_key=graph_keys().group_key(group),
        instance_key=_key_for_rows(instance_key, value),
        merge_op="Add", final_op="Id",
        communication_hint=group.communication_hint, timeout=group.timeout,
        name="cross_tower_all_reduce")


# TensorFlow keeps the shape an instance first ran with, so a tensor whose
# rows change between steps (a `cross_tower_concat` of an uneven last batch)
# gets a key per row count, in [2**30, 2**31): above every other key.
ROWS_KEYS_START, MAX_ROWS = 1 << 30, 1 << 20
_ROWS_SLOTS = ((1 << 31) - ROWS_KEYS_START) // MAX_ROWS - 1


def _key_for_rows(instance_key: int, value: tf.Tensor):
  """`instance_key`, or for rows unknown at build time one key per count."""
  shape = value.shape
  if shape.rank in (None, 0) or shape.is_fully_defined() or (
      not shape[1:].is_fully_defined()):
    return instance_key
  slot = graph_keys().rows_slot(instance_key)
  rows = tf.shape(value)[0]
  check = tf.debugging.assert_less(
      rows, MAX_ROWS, message=(
          f"A cross-tower collective joins at most {MAX_ROWS} rows a step; "
          "split the tensor or reduce it before joining it across towers."))
  with tf.control_dependencies([check]):
    return ROWS_KEYS_START + slot * MAX_ROWS + rows


def launch(group: Group, tensors: list, kind: str = "sum") -> list:
  """One collective over `group`, issued on each of this graph's towers.

  Each tower's op runs after the previous `launch` on its device, so every
  device launches the graph's collectives in the same order.

  Args:
    group: the towers; `tensors` are those of `group.local_devices`.
    tensors: one per local tower, same shape (for "sum") and dtype.
    kind: "sum" (all-reduce) or "gather" (all-gather along axis 0).

  Returns:
    One output per local tower, each on that tower's device.
  """
  keys = graph_keys()
  instance_key = keys.instance_key()
  outputs = []
  for device, tensor in zip(group.local_devices, tensors):
    after = keys.launched.get(device)
    with tf.device(device), tf.control_dependencies(
        [] if after is None else [after]):
      outputs.append(_LAUNCHERS[kind](tensor, group, instance_key))
    keys.launched[device] = outputs[-1]
  return outputs


def _sum(tensor, group: Group, instance_key: int) -> tf.Tensor:
  return collective_ops.all_reduce_v2(
      tensor, group_size=group.num_towers,
      group_key=graph_keys().group_key(group), instance_key=instance_key,
      merge_op="Add", final_op="Id", communication_hint=group.launch_hint,
      timeout=group.timeout, name="all_reduce")


def _gather(tensor, group: Group, instance_key: int) -> tf.Tensor:
  return collective_ops.all_gather_v2(
      tensor, group_size=group.num_towers,
      group_key=graph_keys().group_key(group), instance_key=instance_key,
      communication_hint=group.launch_hint, timeout=group.timeout,
      name="all_gather")


_LAUNCHERS = {"sum": _sum, "gather": _gather}


CLUSTER_KEYS_START = 1_000_000_001


def restart_keys(start: int = CLUSTER_KEYS_START) -> None:
  """Numbers the keys of the graphs built from now on from `start`.

  Every task of an all-reduce job calls this before building its training
  graph, so the tasks number that graph's collectives alike, whatever other
  graphs each built before (a resumed chief builds one to check its
  checkpoint; the process-wide counter would then be ahead on the chief and
  the first collective would wait for a key no other task uses). Call it
  once per process, before the only graph that runs collectives on the
  task's server.
  """
  global _KEYS  # pylint: disable=global-statement
  with _LOCK:
    _KEYS = itertools.count(start=start)
