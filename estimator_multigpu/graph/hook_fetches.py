"""What the model_fn's hooks fetch: the global batch's, not tower 0's shard's.

Hooks are kept once, from tower 0 (contract item 9), so a tensor a hook
fetches is tower 0's. Each such tensor is paired with the same tensor of
every other tower (the same op type at the same position in the tower's ops,
same dtype; a per-example tensor may differ in its first dimension) and its
value becomes the global batch's:

    a per-example tensor (`dataflow.ROWS`):  every tower's, concatenated along
                                             axis 0 in tower order (= input order)
    a statistic of the shard (a scalar):     combined as `readouts.Readouts`
                                             combines it (loss weight, nᵢ/n, Σ)

Where: (1) when the graph is built, the hook's attributes that hold such a
tensor or its name (directly, or one level deep in a dict, list or tuple:
`LoggingTensorHook`, a custom hook keeping `self.tensor`) are replaced by the
global tensor; a scalar summary op a hook holds (`SummarySaverHook`) reads
the combined scalar; (2) at run time (the graph is final), the hook's
`before_run` and `after_run` are wrapped on the instance (its class and
identity unchanged): the fetches `before_run` returns are extended with
every tower's counterpart, and `after_run` receives the combined values. A
fetch that cannot be paired with every tower keeps tower 0's value and is a
WARNING naming the hook and the tensor, once per hook and tensor.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from absl import logging
import numpy as np
import tensorflow as tf

from estimator_multigpu.graph import dataflow
from estimator_multigpu.graph import state_updates

tf1 = tf.compat.v1
ROWS = "rows"
_FIX = ("compute it the same way in every tower (not under a condition on "
        "the tower), or gather it over the global batch with "
        "emg.cross_tower_concat / emg.cross_tower_sum")


@dataclasses.dataclass
class Pairing:
  """Tower 0's tensor with its counterpart in every tower.

  Attributes:
    kind: `ROWS`, or how a statistic combines ("loss", "mean", "sum").
    tensors: every tower's tensor, tower 0's first.
    weights: a statistic's weight per tower (floats or tensors).
  """
  kind: str
  tensors: list
  weights: list = dataclasses.field(default_factory=list)

  def extra_fetches(self) -> list:
    """What to fetch besides tower 0's tensor to combine it at run time."""
    return self.tensors[1:] + [w for w in self.weights
                               if isinstance(w, tf.Tensor)]

  def combine(self, first, extra: list):
    """The global value from tower 0's value and `extra_fetches`' values."""
    count = len(self.tensors) - 1
    values = [np.asarray(first)] + [np.asarray(v) for v in extra[:count]]
    if self.kind == ROWS:
      return np.concatenate(values, axis=0)
    fetched = iter(extra[count:])
    weights = np.array([next(fetched) if isinstance(w, tf.Tensor) else w
                        for w in self.weights], np.float64)
    if self.kind == "sum":
      weights = (weights > 0).astype(np.float64)
    total = sum(np.where(w == 0, 0.0, w * v) for w, v in zip(weights, values))
    return np.asarray(total, values[0].dtype)


class GlobalFetches:
  """Pairs tower 0's tensors with every tower's; builds the global ones.

  Args:
    readouts: a `readouts.Readouts` of these towers (scalar statistics).
    towers: the built towers.
    shares: each tower's share of the global batch, nᵢ / n.
    analysis: tower 0's `dataflow.ShardAnalysis`.
    ranges: the `readouts.OpRanges` that recorded the towers' ops.
  """

  def __init__(self, readouts, towers: list, shares: list,
               analysis: dataflow.ShardAnalysis, ranges):
    self._readouts, self._towers, self._shares = readouts, towers, shares
    self._analysis, self._ranges = analysis, ranges
    self._by_type: dict = {}
    self._concats: dict = {}
    self._pairings: dict = {}
    self._warned: set = set()

  def global_tensor(self, tensor: tf.Tensor, what: str) -> Optional[tf.Tensor]:
    """The global batch's tensor in place of tower 0's (graph time), or None
    to keep it (not tower 0's shard's, or unpaired: warned)."""
    if not self._in_tower0(tensor):
      return None
    status = self._analysis.status(tensor)
    if status == dataflow.STATISTIC:
      return self._readouts.combined(tensor, what)
    pairing = self.pairing(tensor, what) if status == dataflow.ROWS else None
    if pairing is None:
      return None
    if tensor.ref() not in self._concats:
      with tf.name_scope("global_batch_readout"):
        self._concats[tensor.ref()] = tf.concat(pairing.tensors, axis=0)
    return self._concats[tensor.ref()]

  def pairing(self, tensor: tf.Tensor, what: str) -> Optional[Pairing]:
    """Tower 0's per-example tensor or statistic with every tower's (reads
    the graph only: usable once it is final); None when it is not tower 0's
    shard's or cannot be paired (warned)."""
    if not self._in_tower0(tensor):
      return None
    key = (what.split(".")[0], tensor.ref())
    if key not in self._pairings:  # at run time: once per hook and tensor.
      self._pairings[key] = self._pair(tensor, what)
    return self._pairings[key]

  def _pair(self, tensor: tf.Tensor, what: str) -> Optional[Pairing]:
    status = self._analysis.status(tensor)
    if status == dataflow.ROWS:
      return self._paired(tensor, what, ROWS, self._rows_counterpart, [])
    if status != dataflow.STATISTIC or not tensor.dtype.is_floating:
      return None
    kind = self._readouts.kind(tensor)
    weights = ([t.loss_weight for t in self._towers] if kind == "loss"
               else list(self._shares))
    return self._paired(tensor, what, kind, self._ranges.counterpart,
                        weights)

  def _paired(self, tensor, what, kind, counterpart, weights):
    others = [counterpart(tensor, i) for i in range(1, len(self._towers))]
    if kind is None or any(other is None for other in others):
      self._warn(tensor, what, kind)
      return None
    return Pairing(kind, [tensor] + others, weights)

  def _warn(self, tensor: tf.Tensor, what: str, kind) -> None:
    key = (what.split(".")[0], tensor.name)  # the hook's class, the tensor.
    if key in self._warned:
      return
    self._warned.add(key)
    held = ("a per-example tensor" if kind == ROWS else "a statistic")
    logging.warning(
        "hook %s fetches %s, %s of tower 0's shard that `multi_gpu` cannot "
        "pair with every tower (or combine over them): the hook sees tower "
        "0's shard only, not the global batch. Fix: %s.", what, tensor.name,
        held, _FIX)

  def _in_tower0(self, tensor) -> bool:
    return isinstance(tensor, tf.Tensor) and self._ranges.in_tower(tensor, 0)

  def _rows_counterpart(self, tensor: tf.Tensor,
                        index: int) -> Optional[tf.Tensor]:
    """Tower `index`'s tensor in the place of tower 0's per-example
    `tensor`: its first dimension is that tower's shard's."""
    mine, theirs = (self._typed(0, tensor.op.type),
                    self._typed(index, tensor.op.type))
    if tensor.op not in mine or len(mine) != len(theirs):
      return None
    other = theirs[mine.index(tensor.op)].outputs[tensor.value_index]
    if other.dtype != tensor.dtype or other.shape.rank != tensor.shape.rank:
      return None
    if other.shape.rank and not other.shape[1:].is_compatible_with(
        tensor.shape[1:]):
      return None
    return other

  def _typed(self, index: int, op_type: str) -> list:
    key = (index, op_type)
    if key not in self._by_type:
      self._by_type[key] = [op for op in self._ranges.ops.get(index, [])
                            if op.type == op_type]
    return self._by_type[key]

  def combine_summary(self, tensor: tf.Tensor, what: str) -> None:
    """A scalar summary op a hook holds (alone or merged) reads the global
    batch's scalar."""
    ops = ([t.op for t in tensor.op.inputs] if tensor.op.type ==
           "MergeSummary" else [tensor.op])
    for op in ops:
      if op.type == "ScalarSummary" and self._ranges.in_tower(op.outputs[0], 0):
        value = self._readouts.combined(op.inputs[1], what)
        if value is not None:
          op._update_input(1, value)  # pylint: disable=protected-access


def global_batch_hooks(fetches: GlobalFetches, hooks) -> None:
  """Every hook in `hooks` fetches the global batch's values (module doc)."""
  for hook in hooks or ():
    if not hasattr(hook, "__dict__"):  # __slots__: nothing to rewrite.
      continue
    rewrite_attributes(hook, fetches)
    run_peer_collectives(hook)
    RunTimeFetches.wrap(hook, fetches)


def rewrite_attributes(hook, fetches: GlobalFetches) -> None:
  """The hook's attributes hold the global tensors (graph time)."""
  tags = _tags(hook)
  for name, value in list(vars(hook).items()):
    if name in tags:
      continue
    what = f"{type(hook).__name__}.{name}"

    def global_leaf(tensor, what=what):
      if tensor.dtype == tf.string:
        fetches.combine_summary(tensor, what)
        return tensor
      new = fetches.global_tensor(tensor, what)
      return tensor if new is None else new
    replaced = map_leaves(value, global_leaf)
    if replaced is not value:
      setattr(hook, name, replaced)


def _tags(hook) -> set:
  """Attributes that list the keys of a dict attribute (the tags of a
  `LoggingTensorHook`), not tensor names."""
  keys = [set(v) for v in vars(hook).values() if isinstance(v, dict)]
  return {name for name, value in vars(hook).items()
          if isinstance(value, (list, tuple)) and value and
          all(isinstance(v, str) for v in value) and
          any(set(value) <= k for k in keys)}


def run_peer_collectives(hook) -> None:
  """Tensors the hook holds that reach a cross-tower collective run it in
  every tower: each becomes an identity that waits for the peers (after
  them, not before: the peers need tower 0's collective to finish); a
  collective waits for every tower of its group (the 600 s timeout)."""
  def with_peers(tensor):
    peers = state_updates.peer_collectives(state_updates.ancestors([tensor]))
    if not peers:
      return tensor
    with tf.control_dependencies(peers):
      return tf.identity(tensor)
  for name, value in list(vars(hook).items()):
    replaced = map_leaves(value, with_peers)
    if replaced is not value:
      setattr(hook, name, replaced)


def map_leaves(value, fn):
  """`value` with `fn` applied to its tensors (or tensor names), one level
  of dict/list/tuple deep; `value` itself when nothing changed."""
  if isinstance(value, dict):
    new = {k: _map_leaf(v, fn) for k, v in value.items()}
    return value if all(new[k] is value[k] for k in value) else new
  if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
    new = [_map_leaf(v, fn) for v in value]
    return value if all(a is b for a, b in zip(new, value)) else type(value)(
        new)
  return _map_leaf(value, fn)


def _map_leaf(value, fn):
  tensor = _as_tensor(value, tf1.get_default_graph(), bare_names=True)
  if tensor is None:
    return value
  new = fn(tensor)
  return value if new is tensor else new


def _as_tensor(value, graph, bare_names: bool) -> Optional[tf.Tensor]:
  """`value` if a tensor, the tensor it names (`op:0`; a bare op name when
  `bare_names`), else None."""
  if isinstance(value, tf.Tensor):
    return value
  if not isinstance(value, str) or not (bare_names or ":" in value):
    return None
  try:
    element = graph.as_graph_element(value if ":" in value else value + ":0")
  except (KeyError, ValueError, TypeError):
    return None
  return element if isinstance(element, tf.Tensor) else None


class RunTimeFetches:
  """A hook's `before_run` / `after_run`, answered with the global batch.

  Installed on the hook instance (`wrap`), so its class, identity and other
  methods stay the user's.
  """

  def __init__(self, hook, fetches: GlobalFetches):
    self._hook, self.fetches = hook, fetches
    self._before, self._after = hook.before_run, hook.after_run
    self._pending: Optional[tuple] = None

  @classmethod
  def wrap(cls, hook, fetches: GlobalFetches) -> None:
    """Installs the wrapper on `hook` (again: only its `fetches` change)."""
    installed = vars(hook).get("_global_batch_fetches")
    if installed is not None:
      installed.fetches = fetches
      return
    wrapper = cls(hook, fetches)
    hook._global_batch_fetches = wrapper  # pylint: disable=protected-access
    hook.before_run, hook.after_run = wrapper.before_run, wrapper.after_run

  def before_run(self, run_context):
    args = self._before(run_context)
    self._pending = None
    if not isinstance(args, tf1.train.SessionRunArgs):
      return args
    leaves = tf.nest.flatten(args.fetches)
    graph = run_context.session.graph
    what = type(self._hook).__name__
    pairings = [self._pairing(leaf, graph, what) for leaf in leaves]
    if not any(pairings):
      return args
    self._pending = (args.fetches, pairings)
    return tf1.train.SessionRunArgs(
        {"hook": args.fetches,
         "towers": [p.extra_fetches() if p else [] for p in pairings]},
        args.feed_dict, args.options)

  def _pairing(self, leaf, graph, what: str) -> Optional[Pairing]:
    tensor = _as_tensor(leaf, graph, bare_names=False)
    if tensor is None:
      return None
    return self.fetches.pairing(tensor, what)

  def after_run(self, run_context, run_values):
    return self._after(run_context, self.seen(run_values))

  def seen(self, run_values):
    """The run's values as the hook sees them: the global batch's."""
    if self._pending is None:
      return run_values
    structure, pairings = self._pending
    results = run_values.results
    values = tf.nest.flatten(results["hook"])
    if len(values) != len(pairings):  # a fetch tf.nest expands: unchanged.
      combined = results["hook"]
    else:
      combined = tf.nest.pack_sequence_as(structure, [
          p.combine(v, extra) if p else v
          for p, v, extra in zip(pairings, values, results["towers"])])
    return tf1.train.SessionRunValues(combined, run_values.options,
                                      run_values.run_metadata)


def seen_by(hook, run_values):
  """`run_values` as `hook`'s own after_run sees them (the global batch's
  when `multi_gpu` answers its run-time fetches)."""
  installed = vars(hook).get("_global_batch_fetches")
  return run_values if installed is None else installed.seen(run_values)

