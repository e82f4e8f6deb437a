"""The op hook: while a tower is built, each new op classified, and rewritten
where it cannot stay on the shard as it is (see the package doc).

`TowerRewrite` holds one tower's kinds (every tensor the tower made, by its
kind) and builds the rewrites; `state.tower_scope` installs it around the
tower's model_fn call. Gradient construction is not hooked (`compat.op_hooks`);
ops inside `tf.while_loop` bodies and ops the package builds for its own
cross-tower tools (`package_ops`) are classified, never rewritten. Ops
inside `tf.cond` branches are rewritten like the others: every tower's cond
then runs wherever tower 0's runs (`Shared.run_branches_together`), and a
predicate of the tower's own rows is refused (`_check_branches`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu.compat import op_hooks
from estimator_multigpu.graph.global_batch import exchange
from estimator_multigpu.graph.global_batch import kinds as K
from estimator_multigpu.graph.global_batch import probe
from estimator_multigpu.graph.global_batch import shape_rules
from estimator_multigpu.graph.global_batch import table
from estimator_multigpu.graph.global_batch.op_view import OpView

tf1 = tf.compat.v1
_BRANCHING = frozenset({"If", "StatelessIf"})
_LOOP_GRAPHS = frozenset({"WhileBodyFuncGraph", "WhileCondFuncGraph"})
_CONTROL_FLOW = frozenset("If StatelessIf While StatelessWhile Case "
                          "StatelessCase PartitionedCall "
                          "StatefulPartitionedCall".split())


@dataclasses.dataclass
class Rewrite:
  """One op computed on the global batch (or with global statistics).

  Attributes:
    op_type: the op's type.
    name: the name of the op the model_fn built (left unused).
    how: "global" (on the gathered batch), "local" (its statistics and sizes
      made global) or "combined" (a reduction over the batch axis combined
      over the towers).
    gathered: how many per-example tensors were gathered for it.
    statistics: how many statistics or sizes were all-reduced for it.
  """
  op_type: str
  name: str
  how: str
  gathered: int = 0
  statistics: int = 0


@dataclasses.dataclass
class Shared:
  """What the towers of one graph share: tower 0's stateful rewrites (run
  once per step; towers 1.. take their outputs) and, per rewrite, the op of
  tower 0 that reads what the towers exchanged: it waits for every tower's
  exchange, so a value read from tower 0 alone (a metric of a global
  value) never leaves a peer's collective unrun (a hang)."""
  stateful: list = dataclasses.field(default_factory=list)
  anchors: list = dataclasses.field(default_factory=list)

  branches: list = dataclasses.field(default_factory=list)  # per tf.cond.
  _seen: dict = dataclasses.field(default_factory=dict)

  def join_branch(self, tower_index: int, op: tf.Operation) -> None:
    """Records every tower's `tf.cond` that exchanges with the others, in
    tower 0's order (`run_branches_together`)."""
    position = self._seen[tower_index] = self._seen.get(tower_index, -1) + 1
    if tower_index == 0:
      self.branches.append([op])
    elif position < len(self.branches):
      self.branches[position].append(op)

  def run_branches_together(self, graph: tf.Graph) -> None:
    """What runs tower 0's `tf.cond` runs the other towers' beside it (a
    cond only tower 0's train_op runs, a write's, would leave its
    collectives waiting). Its consumers wait for them; the cond itself
    must not, or it would wait for collectives that wait for it."""
    firsts = {conds[0]: [_ran(c) for c in conds[1:]]
              for conds in self.branches if conds[1:]}
    for op in graph.get_operations() if firsts else ():
      peers = [p for c in op.control_inputs for p in firsts.get(c, ())] + [
          p for t in op.inputs for p in firsts.get(t.op, ())]
      if peers:
        compat.private(op, "_add_control_inputs")(
            [p for p in peers if p is not op and p not in op.control_inputs])

  def join(self, tower_index: int, position: int, anchor: tf.Operation,
           exchanged: list) -> None:
    """Tower 0 records its `anchor`; the others make it wait for theirs."""
    if tower_index == 0:
      self.anchors.append(anchor)
    elif exchanged and position < len(self.anchors) and (
        self.anchors[position] is not None and anchor is not None):
      compat.private(self.anchors[position], "_add_control_inputs")(
          [t.op for t in exchanged])


class TowerRewrite:
  """One tower's classification and rewrites.

  Args:
    tower_index: the tower's position in its graph.
    leaves: (tensor, kind) of the shard's inputs.
    share: the tower's share of the global batch, nᵢ / n.
    share_kind: the kind of a loss share (`MEAN` for "mean", else `SUM`).
    shared: the graph's `Shared`.
    mark: called with (tensor, kind) for every tensor a rewrite returns.
    may_be_empty: whether a shard may be empty (a mean over the batch axis
      is then 0, not NaN, there; every tower builds it alike).
  """

  def __init__(self, tower_index: int, leaves: list, share: Any,
               share_kind: K.Kind, shared: Shared,
               mark: Optional[Callable] = None, may_be_empty: bool = False):
    self.tower_index, self.may_be_empty = tower_index, may_be_empty
    self.graph = tf1.get_default_graph()
    self.kinds = {t.ref(): k for t, k in leaves}
    self.share, self.share_kind, self.shared = share, share_kind, shared
    self.records: list = []
    self.suspended = 0
    self._mark = mark or (lambda tensor, kind: None)
    self._stateful_seen = 0
    self._exchanged: list = []
    self._losses: dict = {}  # a loss's ref -> what `tower_loss` made of it.
    self._rewritten_bodies: set = set()  # names of branches with rewrites.
    self._bodies: dict = {}  # name -> a branch's graph, as hooked.
    # Refs of what the rewrites made the global batch's, and what is
    # computed from them with uniform kind.
    self.global_values: set = set()

  def kind_of(self, tensor: tf.Tensor) -> K.Kind:
    kind = self.kinds.get(tensor.ref())
    if kind is not None:
      return kind
    for external, internal in getattr(tensor.graph, "captures", ()):
      if internal is tensor:
        return self.kind_of(external)
    return K.UNIFORM

  def set_kind(self, tensor: tf.Tensor, kind: K.Kind) -> None:
    self.kinds[tensor.ref()] = kind

  def hook(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
    """The op hook (`compat.op_hooks`)."""
    del op_type, attrs, op_name
    op = op_hooks.original_op()
    if op is None or not _inside(graph, self.graph) or (
        graph is not self.graph and op.type == "Placeholder"):
      return None  # a body's placeholder: its capture's kind (`kind_of`).
    if graph is not self.graph:
      self._bodies[graph.name] = graph
    view = OpView(op, inputs, [self.kind_of(t) for t in inputs])
    if op.type in _BRANCHING:
      self._check_branches(view)
      if outputs:
        return self._keep(outputs, self._branch_kinds(view), inputs)
    if not outputs:
      return self._write(view, graph)
    verdict = table.classify(view)
    if isinstance(verdict, list):
      shape = shape_rules.reshaped_rows(view)
      if shape is not None:
        outputs[0].set_shape(shape)
      if verdict == [K.MEAN] and view.type == "Mean" and self.may_be_empty and (
          graph is self.graph and not self.suspended and
          view.inputs[0].dtype.is_floating):
        return self._mean_or_zero(view.op)
      return self._keep(outputs, verdict, inputs)
    loop = _loop_of(graph, self.graph)
    if loop is not None and verdict != K.GLOBALLY and not self.suspended and (
        view.of("rows")):
      _refuse_in_loop(view, loop)
    if self.suspended or loop is not None or op.type in _CONTROL_FLOW:
      return self._keep(outputs, _unrewritten(view, verdict))
    return self._rewrite(view, verdict, outputs)

  def _check_branches(self, view: OpView) -> None:
    """A `tf.cond` whose branches run on the global batch takes the same
    branch in every tower, or the towers' collectives would wait for each
    other forever.

    Raises:
      ValueError: its predicate is not the same in every tower.
    """
    names = {view.op.get_attr(a).name for a in ("then_branch", "else_branch")}
    if not names & self._rewritten_bodies:
      return
    if view.kinds[0].is_uniform:  # tower 0's runs every tower's (a write's
      self.shared.join_branch(self.tower_index, view.op)  # cond runs in 0).
      return
    raise ValueError(
        f"multi_gpu: the tf.cond {view.op.name} computes on the global batch "
        f"inside its branches ({', '.join(sorted(names & self._rewritten_bodies))}"
        "), but its predicate depends on the tower's own rows (rows counted "
        "by their values, e.g. of tf.where), so the towers could take "
        "different branches and wait for each other forever. Make the "
        "predicate the same for the whole batch (a statistic of the batch, "
        "the global step), or compute both branches' values before the "
        "tf.cond and select between them.")

  def _branch_kinds(self, view: OpView) -> list:
    """A `tf.cond`'s outputs: what both branches return (a mean of the
    shard in one and a value the same in every tower in the other is a
    mean; rows of different kinds are kept per shard, `LOCAL`)."""
    bodies = [self._bodies.get(view.op.get_attr(a).name)
              for a in ("then_branch", "else_branch")]
    kinds = []
    for i in range(view.num_outputs):
      pair = {self.kind_of(b.outputs[i]) if b is not None and
              i < len(b.outputs) else K.LOCAL for b in bodies}
      if K.MEAN in pair:
        pair.discard(K.UNIFORM)
      kinds.append(pair.pop() if len(pair) == 1 else K.LOCAL)
    return kinds

  def _mean_or_zero(self, op: tf.Operation) -> list:
    """A mean over the batch axis that is 0, not 0/0, on an empty shard (a
    MEAN weighs it by 0, but a NaN would still reach the gradients through
    what multiplies it: `mean * rsqrt(variance)`)."""
    values, axes = op.inputs
    self.suspended += 1
    try:
      total = tf.reduce_sum(values, axes, keepdims=op.get_attr("keep_dims"))
      count = tf.cast(tf.size(values), total.dtype) / tf.cast(
          tf.maximum(tf.size(total), 1), total.dtype)
      mean = tf.math.divide_no_nan(total, count)
    finally:
      self.suspended -= 1
    self.set_kind(mean, K.MEAN)
    return [mean]

  def tower_loss(self, loss: tf.Tensor) -> tf.Tensor:
    """`loss` as the towers' combination counts it: of the loss reduction's
    kind (a MEAN Σᵢ wᵢ·lossᵢ, a SUM Σᵢ lossᵢ). A statistic of the other
    kind is made global; a global (uniform) value under "sum" is this
    tower's share of it, wᵢ·loss, so the towers count it once."""
    kind = self.kind_of(loss).plain
    if kind == self.share_kind or not (kind.is_statistic or kind.is_uniform) or (
        kind.is_uniform and self.share_kind == K.MEAN):
      return loss
    if loss.ref() not in self._losses:
      self.suspended += 1
      try:
        converted = loss
        if kind.is_statistic:
          converted = exchange.global_statistic(loss, kind.name, self.share)
        if self.share_kind == K.SUM:
          converted = tf.math.multiply_no_nan(
              converted, tf.cast(self.share, converted.dtype))
      finally:
        self.suspended -= 1
      self.set_kind(converted, self.share_kind)
      self._losses[loss.ref()] = converted
    return self._losses[loss.ref()]

  def _keep(self, outputs, kinds, inputs=()) -> None:
    derived = any(t.ref() in self.global_values for t in inputs)
    for tensor, kind in zip(outputs, kinds):
      self.set_kind(tensor, kind)
      if derived and kind.is_uniform:
        self.global_values.add(tensor.ref())
    return None

  def _write(self, view: OpView, graph) -> None:
    """An op without outputs (a variable's write) of the shard's rows (a
    scatter of per-example ids and values, rows beside the global batch's
    values) or of a statistic of the shard (a moving average of the batch's
    mean): its rows are gathered and its statistics made global, so it
    writes the global batch's values, once per step, in one device's order
    (tower 0's write: `state_updates`)."""
    writes = any(t.dtype == tf.resource for t in view.inputs)
    touched = [i for i, k in enumerate(view.kinds) if k.is_rows or writes and (
        k.is_statistic or k.is_shape)]  # (an assert of a shape: not a write)
    if not touched or graph is not self.graph or self.suspended:
      return None
    record = Rewrite(view.type, view.op.name, K.GLOBALLY)
    inputs, _ = self._global_values(view, record)
    for i in touched:
      if view.kinds[i].is_rows:
        inputs[i] = exchange.gather(inputs[i], view.kinds[i].axis)[0]
        record.gathered += 1
      self.set_kind(inputs[i], K.UNIFORM)
      self.global_values.add(inputs[i].ref())
    _rewire(view.op, inputs)
    self.records.append(record)  # tower 0's write waits for every exchange.
    self.shared.join(self.tower_index, len(self.records) - 1, view.op,
                     [inputs[i] for i in touched])
    self._exchanged = []
    return None

  def _rewrite(self, view: OpView, verdict: str, outputs) -> list:
    if verdict == K.COMBINED:
      return self._combined(view, outputs)
    record = Rewrite(view.type, view.op.name, verdict)
    inputs, kinds = self._global_values(view, record)
    if verdict == K.LOCALLY:
      local = table.classify(OpView(view.op, inputs, kinds))
      if isinstance(local, list):
        self.records.append(record)
        return self._returned(_rewire(view.op, inputs), local)
      record.how = K.GLOBALLY
    return self._global(view, inputs, kinds, record)

  def _global_values(self, view: OpView, record: Rewrite) -> tuple:
    """The inputs with statistics and sizes at their global values."""
    inputs, kinds = [], []
    for tensor, kind in zip(view.inputs, view.kinds):
      if kind.is_statistic:
        tensor = exchange.global_statistic(tensor, kind.name, self.share)
        self._exchanged.append(tensor)
      elif kind.is_shape:
        tensor = exchange.global_shape(tensor, kind.axis)
        self._exchanged.append(tensor)
      record.statistics += kind.is_statistic or kind.is_shape
      inputs.append(tensor)
      kinds.append(K.UNIFORM if kind.is_statistic or kind.is_shape else kind)
    return inputs, kinds

  def _global(self, view: OpView, inputs, kinds, record: Rewrite) -> list:
    """The op on the gathered rows; its per-example outputs sliced back."""
    gathered, back = [], None
    for tensor, kind in zip(inputs, kinds):
      if kind.is_rows:
        tensor, offset, rows = exchange.gather(tensor, kind.axis)
        self._exchanged.append(tensor)
        back = back or (offset, rows)
        record.gathered += 1
      gathered.append(tensor)
    outputs = self._run_once(view.op, gathered)
    axes = probe.aligned_axes(view.op, view.inputs, view.kinds)
    results, out_kinds = [], []
    for output, axis in zip(outputs, axes):
      if axis is not None and back is not None:
        output = exchange.rows_back(output, axis, *back)
      results.append(output)
      out_kinds.append(K.UNIFORM if axis is None or back is None
                       else K.rows(axis))
    self.records.append(record)
    return self._returned(results, out_kinds)

  def _run_once(self, op: tf.Operation, inputs: list) -> list:
    """A stateful op (a `tf.py_func`) runs in tower 0 only: the others take
    its outputs, after their own gathers (whose collectives must run)."""
    if not op.op_def.is_stateful or op.graph is not self.graph:
      return _rewire(op, inputs)  # in a branch: each tower's runs.
    position = self._stateful_seen
    self._stateful_seen += 1
    if self.tower_index == 0:
      outputs = _rewire(op, inputs)
      self.shared.stateful.append(outputs)
      return outputs
    with tf.control_dependencies(inputs):
      return [tf.identity(t) for t in self.shared.stateful[position]]

  def _combined(self, view: OpView, outputs) -> list:
    record = Rewrite(view.type, view.op.name, K.COMBINED, statistics=1)
    self.records.append(record)
    if view.type == "Mean":
      result = _mean_by_counts(view.inputs[0], outputs[0])
    else:
      result = exchange.combined(outputs[0], view.type)
    self._exchanged.append(result)
    return self._returned([result], [K.UNIFORM])

  def _returned(self, outputs: list, kinds: list) -> list:
    graph = outputs[0].graph
    while graph is not self.graph:  # a branch's: its own, not joined.
      self._rewritten_bodies.add(graph.name)
      graph = graph.outer_graph
    self.shared.join(self.tower_index, len(self.records) - 1,
                     outputs[0].op if outputs[0].graph is self.graph else None,
                     self._exchanged)
    self._exchanged = []
    for tensor, kind in zip(outputs, kinds):
      self.set_kind(tensor, kind)
      self._mark(tensor, kind)
      if kind.is_uniform:
        self.global_values.add(tensor.ref())
    return outputs


def _ran(cond: tf.Operation) -> tf.Operation:
  """An op that runs `cond`'s branch: a read of its output (a control edge
  from a lowered cond waits for its predicate only, not its branch)."""
  if not cond.outputs:
    return cond
  with tf.control_dependencies(None), tf.device(cond.device):
    return tf.identity(cond.outputs[0], name=f"{cond.name}_ran").op


def _mean_by_counts(values: tf.Tensor, mean: tf.Tensor) -> tf.Tensor:
  """The global mean of a mean over rows counted by their values: an empty
  shard's NaN counts for nothing; with no rows in the global batch it is
  one device's mean of nothing, NaN."""
  count = tf.cast(tf.size(values), mean.dtype) / tf.cast(
      tf.maximum(tf.size(mean), 1), mean.dtype)
  total = exchange.global_statistic(tf.math.multiply_no_nan(mean, count),
                                    "sum", None)
  return total / exchange.global_statistic(count, "sum", None)


def _unrewritten(view: OpView, verdict: str) -> list:
  """The kinds of an op left as it is where it would be rewritten."""
  if verdict == K.LOCALLY:
    kinds = [K.UNIFORM if k.is_statistic or k.is_shape else k
             for k in view.kinds]
    local = table.classify(OpView(view.op, view.inputs, kinds))
    if isinstance(local, list):
      return local
  if verdict == K.COMBINED:
    return [K.UNIFORM] * view.num_outputs
  return [K.LOCAL] * view.num_outputs


def _rewire(op: tf.Operation, inputs: list) -> list:
  """`op` itself computes on `inputs` (its global values): its name, which
  a hook, a summary or a fetch by name reads, is the global batch's. Its
  outputs' shapes are relaxed where the new inputs make them differ."""
  for index, (old, new) in enumerate(zip(op.inputs, inputs)):
    if new is not old:
      compat.private(op, "_update_input")(index, new)
  return list(op.outputs)


def _loop_of(graph, tower_graph):
  """The `tf.while_loop` body or condition `graph` is (inside), or None:
  its loop variables' kinds are not known, so nothing there is rewritten."""
  while graph is not None and graph is not tower_graph:
    if type(graph).__name__ in _LOOP_GRAPHS:
      return graph
    graph = getattr(graph, "outer_graph", None)
  return None


def _refuse_in_loop(view: OpView, loop) -> None:
  """A statistic of the batch meeting its examples inside a loop's body.

  Raises:
    ValueError: always, naming the loop, the op and the fix.
  """
  raise ValueError(
      f"multi_gpu: {view.op.name} ({view.type}) inside the tf.while_loop "
      f"{loop.name} (tf.map_fn, tf.foldl, tf.scan are loops too) combines "
      "the batch's examples with a statistic of the batch (a mean, a sum, a "
      "max over it). Each tower would compute it over its own shard only, "
      "and multi_gpu cannot run a loop's body on the global batch. Compute "
      "what combines them before the loop (e.g. x - tf.reduce_mean(x, 0) "
      "outside tf.map_fn: it is then the global batch's) and pass the "
      "result in, or vectorize the loop.")


def _inside(graph, tower_graph) -> bool:
  while graph is not None:
    if graph is tower_graph:
      return True
    graph = getattr(graph, "outer_graph", None)
  return False
