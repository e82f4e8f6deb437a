"""Readouts built once from the global batch, at the API the user calls.

Exact by construction (contract item 22). While the towers are built, the
APIs through which a model_fn reads its batch are wrapped (`readout_apis`):
metrics (`tf.compat.v1.metrics.*`, tf-slim's and TF-Ranking's metrics, a
Keras `Metric.update_state`, a `TPUEstimatorSpec`'s `eval_metrics` and
`host_call`) and summaries (`tf.compat.v1.summary.*`, TF2 `tf.summary.*`).

- Tower 0's call runs the real API once, on *stubs*: an identity in place
  of each tensor argument computed from the shard, with its batch dimension
  left unknown.
- Towers 1.. do not call it: they get tower 0's result (a Keras metric
  also builds its own update, never run, for the variables it makes
  lazily), and their arguments are recorded, call by call.
- Once every tower is built, `Recorder.bind` feeds each stub the global
  batch's value (`global_values`): per-example tensors joined in tower
  order, a shard statistic combined over the towers by what it is; one of
  no such kind keeps tower 0's value, with a WARNING naming the API and the
  fix.

So the API sees exactly the tensors one device would, and its result is one
device's whatever it computes from them; one update runs per step, so
repeated evaluations agree. Calls made inside a `tf.cond` or `tf.while_loop`
body, and calls nested in another wrapped call, run as written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import threading
from typing import Any, Callable, Optional

import tensorflow as tf

from estimator_multigpu.graph import dataflow
from estimator_multigpu.graph import global_values
from estimator_multigpu.graph import shard_statistics
from estimator_multigpu.graph import sharing
from estimator_multigpu.graph import tensor_kinds
from estimator_multigpu.graph import warn_once
from estimator_multigpu.graph.global_batch import state as global_batch

tf1 = tf.compat.v1

_STATE = threading.local()


@dataclasses.dataclass
class Call:
  """One wrapped API call in tower 0: its stubs, result and what to say."""
  api: str
  stubs: dict  # argument position -> (stub tensors, kind).
  result: Any
  ops: set = dataclasses.field(default_factory=set)  # the ops it built.
  problems: list = dataclasses.field(default_factory=list)  # (key, text).
  tag: Optional[str] = None  # a summary's name.

  def warn(self, names: str) -> None:
    """Says each problem once per model, naming the readout."""
    for key, text in self.problems:
      warn_once.warn((key, names, self.api), "%s (%s) %s", names, self.api,
                     text)


class Recorder:
  """The wrapped calls of one graph's towers (see the module doc).

  Args:
    analysis: tower 0's `tensor_kinds.ShardAnalysis`.
    loss_reduction: the `multi_gpu` option (how loss terms combine).
  """

  def __init__(self, analysis: tensor_kinds.ShardAnalysis,
               loss_reduction: str = "mean"):
    self._analysis = analysis
    # A loss term's kind: the towers' loss weights are their shares of the
    # examples ("mean") or 1 ("sum").
    self._loss_kind = (shard_statistics.MEAN if loss_reduction == "mean" else
                       shard_statistics.SUM)
    self._calls: list = []  # tower 0's `Call`s, in call order.
    self._arguments: dict = {}  # tower index -> [flat arguments per call].
    # Every op the wrapped calls made, in any tower (stubs included): towers
    # do not line up op for op over them, and their assignments are no
    # metric's own (`metrics`).
    self.built_ops: set = set()

  @contextlib.contextmanager
  def scope(self, tower):
    """Inside: wrapped APIs called by the model_fn go through `call` (with
    `readout_apis.scope`, which puts the wrapped APIs in place)."""
    previous = getattr(_STATE, "current", None)
    _STATE.current = (self, tower.index)
    self._arguments[tower.index] = []
    try:
      yield
    finally:
      _STATE.current = previous

  def call(self, api: str, fn: Callable, args: tuple, kwargs: dict,
           index: int, build_in_peers: bool = False) -> Any:
    """Tower `index`'s call of `fn` (see the module doc)."""
    flat = tf.nest.flatten((args, kwargs))
    self._arguments[index].append(flat)
    if index == 0:
      return self._call_tower0(api, fn, args, kwargs, flat, build_in_peers)
    position = len(self._arguments[index]) - 1
    first = self._first_call(api, position, index)
    if first.tag is not None:
      _collect(fn, args, kwargs, first.result)
    if not build_in_peers:
      return first.result
    with self._recording():
      _run_nested(fn, args, kwargs)
      # Keras adds the graph's newest op as the metric's update: tower 0's.
      return tf.group(*[r for r in [first.result] if r is not None],
                      name="global_batch_update")

  @contextlib.contextmanager
  def _recording(self):
    """Adds the ops made inside to `built_ops` (built once from the global
    batch: not rewritten, `graph.global_batch`)."""
    graph = tf1.get_default_graph()
    start = len(graph.get_operations())
    try:
      with global_batch.package_ops():
        yield
    finally:
      self.built_ops.update(graph.get_operations()[start:])

  def _call_tower0(self, api, fn, args, kwargs, flat,
                   build_in_peers) -> Any:
    with self._recording():
      return self._build_once(api, fn, args, kwargs, flat, build_in_peers)

  def _build_once(self, api, fn, args, kwargs, flat, build_in_peers) -> Any:
    stubs, fed, problems = {}, list(flat), []
    graph = tf1.get_default_graph()
    start = len(graph.get_operations())
    for position, leaf in enumerate(flat):
      kind = self._kind(leaf, problems)
      if kind is not None:
        fed[position] = global_values.stub(leaf, kind == tensor_kinds.ROWS)
        stubs[position] = (fed[position], kind)
        for stub in global_values.components(fed[position]):
          self._analysis.mark_global(stub)
    args, kwargs = tf.nest.pack_sequence_as((args, kwargs), fed)
    with contextlib.ExitStack() as stack:
      if not build_in_peers:
        stack.enter_context(sharing.built_once())
      result = _run_nested(fn, args, kwargs)
    self._calls.append(Call(api, stubs, result,
                            set(graph.get_operations()[start:]), problems,
                            _tag(api, args, kwargs)))
    return result

  def _kind(self, leaf, problems: list) -> Optional[str]:
    """ROWS, STATISTIC ("mean" or "sum" where the global batch's rewrite
    knows which), or None for an argument the shard does not make (or one
    `multi_gpu` cannot join: warned)."""
    tensors = global_values.components(leaf)
    if not tensors:
      return None
    known = global_batch.readout_kind(leaf)  # the rewrite's, when on.
    if known is not None:
      return {"rows": tensor_kinds.ROWS, "uniform": None}.get(known, known)
    if isinstance(leaf, tf.SparseTensor):
      rows = any(self._analysis.status(t) == tensor_kinds.ROWS
                 for t in tensors)
      return tensor_kinds.ROWS if rows else None
    status = self._analysis.status(leaf)
    if status == tensor_kinds.GLOBAL:
      return None
    if status != tensor_kinds.ROWS and self._batch_shaped(leaf):
      # A batch-level value tiled to the shard, weights of ones shaped
      # like it: one row per example all the same.
      return tensor_kinds.ROWS
    if status == tensor_kinds.ROWS:
      return tensor_kinds.ROWS if self._joinable(leaf, problems) else None
    if status == tensor_kinds.STATISTIC or self._from_shard(leaf):
      return tensor_kinds.STATISTIC  # counts and other integers too.
    return None

  def _joinable(self, leaf: tf.Tensor, problems: list) -> bool:
    """Per-example values the towers can join along axis 0; a problem
    about values computed from a statistic of the shard (joined all the
    same)."""
    shape, size = leaf.shape, self._analysis.size
    if (shape.rank or 0) >= 2 and shape[0] is not None and shape[0] != size:
      problems.append((
          "not batch-major",
          f"reads {leaf.name}, per-example values whose first axis "
          f"({shape[0]}) is not the batch's (shape {shape}): `multi_gpu` "
          "joins the towers' values along axis 0, so it shows tower 0's "
          "shard. Fix: put the batch axis first (tf.transpose) before the "
          "call."))
      return False
    if not shard_statistics.whole_shard(leaf, self._analysis):
      problems.append((
          "coupled input",
          f"reads {leaf.name}, per-example values computed from a statistic "
          "of the shard or from some of its rows (each tower computes that "
          "over its own shard), so it is not one device's. Fix: compute the "
          "statistic over the global batch with emg.cross_tower_sum / "
          "emg.cross_tower_concat."))
    return True

  def _from_shard(self, tensor: tf.Tensor) -> bool:
    """Whether `tensor` is computed from the shard's examples other than
    through global values (a rewrite's, a collective's: the same in every
    tower, so what is shaped or counted from them is too)."""
    status = self._analysis.status

    def is_global(op: tf.Operation) -> bool:
      return bool(op.outputs) and all(
          status(t) == tensor_kinds.GLOBAL for t in op.outputs)

    return any(status(t) == tensor_kinds.ROWS
               for op in dataflow.ancestors([tensor], stop=is_global)
               for t in op.outputs)

  def _batch_shaped(self, tensor: tf.Tensor) -> bool:
    """Whether `tensor`'s first dimension is the shard's: its static size
    when above 1, or unknown until the graph runs in a tensor made from the
    shard (through its shape, say)."""
    shape, size = tensor.shape, self._analysis.size
    if not shape.rank:
      return False
    if shape[0] is not None:
      return size is not None and size > 1 and shape[0] == size
    return self._from_shard(tensor)

  def _first_call(self, api: str, position: int, index: int) -> Call:
    if position >= len(self._calls) or self._calls[position].api != api:
      made = [c.api for c in self._calls]
      raise ValueError(
          f"Tower {index} called {api} as its readout call #{position + 1}, "
          f"but tower 0's readout calls were {made}. Every tower must make "
          "the same metric and summary calls, in the same order, "
          "unconditionally (no `if` on the tower or its shard).")
    return self._calls[position]

  def bind(self, towers: list, shares: list) -> None:
    """Feeds every stub the global batch's value (see the module doc)."""
    if len(towers) < 2:
      return
    combiner = global_values.Combiner(self._analysis, self._loss_kind,
                                      towers, shares)
    for position, call in enumerate(self._calls):
      for argument, (stub, kind) in call.stubs.items():
        pieces = [self._arguments[t.index][position][argument]
                  for t in towers]
        global_values.bind(stub, pieces, kind, combiner, call.problems)
      if call.problems:
        call.warn(_names(call, towers[0].spec))


def _names(call: Call, spec) -> str:
  """What the user calls the readout `call` made: its eval metric keys, or
  its summary tag."""
  metrics = getattr(spec, "eval_metric_ops", None) or {}
  keys = [key for key, (value, update) in metrics.items()
          if call.ops & dataflow.ancestors([value, update], control=True)]
  if keys:
    return "eval metric " + ", ".join(repr(k) for k in keys)
  return f"summary {call.tag!r}" if call.tag else "a readout"


def _collect(fn: Callable, args: tuple, kwargs: dict, summary) -> None:
  """Adds tower 0's v1 summary to the collections the call names, as the
  call would in this tower (`tf.compat.v1.summary.merge_all()` inside the
  model_fn then finds it in every tower)."""
  if not isinstance(summary, tf.Tensor) or summary.dtype != tf.string:
    return
  try:
    bound = inspect.signature(fn).bind(*args, **kwargs)
  except (TypeError, ValueError):
    return
  for key in bound.arguments.get("collections") or [
      tf1.GraphKeys.SUMMARIES]:
    tf1.add_to_collection(key, summary)


def _tag(api: str, args: tuple, kwargs: dict) -> Optional[str]:
  if "summary" not in api:
    return None
  name = args[0] if args else kwargs.get("tag", kwargs.get("name"))
  return name if isinstance(name, str) else None


def current() -> Optional[tuple]:
  """(recorder, tower index) while a tower is built, else None."""
  return getattr(_STATE, "current", None)


def wrap(fn: Callable, api: str, build_in_peers: bool = False) -> Callable:
  """`fn`, called once from the global batch inside the towers."""
  def wrapped(*args, **kwargs):
    state = current()
    if (state is None or getattr(_STATE, "nested", False) or
        tf1.get_default_graph().building_function):
      return fn(*args, **kwargs)
    recorder, index = state
    return recorder.call(api, fn, args, kwargs, index, build_in_peers)
  wrapped.__wrapped__ = fn
  return wrapped


def _run_nested(fn: Callable, args: tuple, kwargs: dict) -> Any:
  """Calls `fn` with wrapped APIs it calls in turn running as written."""
  outer = getattr(_STATE, "nested", False)
  _STATE.nested = True
  try:
    return fn(*args, **kwargs)
  finally:
    _STATE.nested = outer
