"""`params["batch_size"]` used as a tower's batch dimension: refused.

Under `multi_gpu`, `params["batch_size"]` stays what the user set: the
global batch (so a loss divided by it, TPUEstimator-style, keeps its
meaning). A tower holds only its shard, at most ⌈B/N⌉ of the B examples,
so TPU-era code that builds a batch dimension from it
(`tf.reshape(x, [params["batch_size"], -1])`,
`cell.zero_state(params["batch_size"], tf.float32)`, `tf.zeros` /
`tf.fill([params["batch_size"], k])`) would fail when the graph runs, or
worse, regroup the shard's numbers silently. `check` finds such a use in
tower 0's graph from the dataflow and refuses it in one line naming
`tf.shape(x)[0]`:

- a Reshape of the shard's per-example values (`tensor_kinds.ROWS`) whose
  target's leading entry is B while its input's is not;
- an op that joins the shard's per-example values (leading dimension not B)
  with a tensor not derived from the shard whose leading dimension is B
  (a state made by `zero_state`, `tf.zeros`, `tf.fill`), into a result whose
  leading dimension is B.

Both need B ≥ 2 and several towers; B comes from `params["batch_size"]`
(an int), and nothing else is looked at. With static shard sizes (an
`input_fn` with `drop_remainder=True`) TensorFlow cannot build such an op at
all: its shape-inference error names the op and its inputs, which exist and
are judged by the same rules (`_check_failed_op`); inside a loop's body
(`tf.compat.v1.nn.dynamic_rnn`'s state), where the inputs are the loop's,
by the shapes the error gives: rows of the shard joined with B rows.
"""

from __future__ import annotations

import contextlib
import math
import re
from typing import Any, Callable, Iterable, Optional

import tensorflow as tf

from estimator_multigpu.graph import dataflow
from estimator_multigpu.graph import shard_statistics
from estimator_multigpu.graph import tensor_kinds
from estimator_multigpu.graph import warn_once

KEY = "batch_size"


def global_batch_param(params: Any) -> Optional[int]:
  """`params["batch_size"]` when it is an int ≥ 2, else None."""
  if not isinstance(params, dict):
    return None
  value = params.get(KEY)
  if isinstance(value, bool) or not isinstance(value, int) or value < 2:
    return None
  return value


def scope_factory(params: Any, split) -> Callable:
  """A tower scope that checks tower 0's ops when its model_fn returns (or
  fails: a layer that needs a static dimension may stop first)."""
  def scope(tower):
    if tower.index > 0:
      return contextlib.nullcontext()
    return _checked(params, split)
  return scope


@contextlib.contextmanager
def _checked(params: Any, split):
  batch = global_batch_param(params)
  if batch is None or len(split.shards) < 2:
    yield
    return
  graph = tf.compat.v1.get_default_graph()
  start = len(graph.get_operations())
  try:
    yield
  except ValueError as error:
    _check_failed_op(error, graph, split, batch)
    check(graph.get_operations()[start:], split, batch)
    raise
  check(graph.get_operations()[start:], split, batch)


def check(ops: Iterable[tf.Operation], split, batch: int) -> None:
  """Raises when tower 0's `ops` use `batch` as a batch dimension.

  Raises:
    ValueError: naming the op, `params["batch_size"]` and `tf.shape(x)[0]`.
  """
  analysis = tensor_kinds.shard_analysis(split.shards[0])
  for op in ops:
    if not op.outputs or _leading(op.outputs[0]) != batch:
      continue
    what = _batch_dimension_use(op.type, list(op.inputs), batch, analysis,
                                target=op.outputs[0].shape)
    if what:
      raise ValueError(_message(what, batch, len(split.shards)))


# TensorFlow's shape-inference error names the op it could not create and
# its inputs: "... for '{{node basic_rnn_cell/concat}} = ConcatV2[...]
# (strided_slice, BasicRNNCellZeroState/zeros, ...)' with input shapes ...".
_FAILED_NODE = re.compile(r"\{\{node [^}]*\}\} = (\w+)\[.*?\]\(([^)]*)\)")


def _check_failed_op(error: ValueError, graph: tf.Graph, split,
                     batch: int) -> None:
  """With static shard sizes the offending op fails to build: its inputs,
  which exist, are looked at the same way."""
  match = _FAILED_NODE.search(str(error))
  if not match:
    return
  inputs = []
  for name in (n.strip() for n in match.group(2).split(",")):
    if name and not name.startswith("^"):
      try:
        inputs.append(graph.as_graph_element(name if ":" in name
                                             else name + ":0"))
      except (KeyError, ValueError):
        _check_failed_in_body(error, match.group(1), split, batch)
        return
  target = None
  if match.group(1) == "Reshape" and len(inputs) == 2:
    target = tf.get_static_value(inputs[1])
    target = None if target is None else tf.TensorShape(
        [d if d >= 0 else None for d in target.tolist()])
  what = _batch_dimension_use(match.group(1), inputs, batch,
                              tensor_kinds.shard_analysis(split.shards[0]),
                              target=target)
  if what:
    raise ValueError(_message(what, batch, len(split.shards))) from error


_INPUT_SHAPES = re.compile(r"with input shapes: (.*?)(?: and with |\.?$)")


def _check_failed_in_body(error: ValueError, op_type: str, split,
                          batch: int) -> None:
  """The op failed inside a loop's body (`tf.compat.v1.nn.dynamic_rnn`'s
  while loop), whose inputs are the loop's: it is judged by the shapes the
  error gives. Joining rows as many as tower 0's static shard with rows as
  many as `params["batch_size"]` is that batch used as a dimension."""
  shard = tensor_kinds.shard_analysis(split.shards[0]).size
  found = _INPUT_SHAPES.search(str(error))
  if shard is None or shard == batch or not found:
    return
  leading = [int(first) for first in re.findall(r"\[(-?\d+)[^\]]*\]",
                                                found.group(1))]
  if shard in leading and batch in leading:
    raise ValueError(_message(
        f"joins rows of the shard ({shard}) with {batch} rows in a {op_type} "
        "inside a loop (tf.compat.v1.nn.dynamic_rnn's state)", batch,
        len(split.shards))) from error


def _leading(tensor: tf.Tensor) -> Optional[int]:
  shape = tensor.shape
  if shape.rank is None or shape.rank == 0:
    return None
  return shape[0]


def _batch_dimension_use(op_type: str, inputs: list, batch: int,
                         analysis: tensor_kinds.ShardAnalysis,
                         target: Optional[tf.TensorShape]) -> Optional[str]:
  """What an op of `op_type` does with `batch` as a batch dimension, or
  None; `target`: its output's shape (a Reshape's target), if known."""
  rows = [t for t in inputs if analysis.is_rows(t) and _leading(t) != batch]
  if not rows:
    return None
  if op_type == "Reshape" and inputs[0] is rows[0]:
    if target is None or not target.rank or target[0] != batch:
      return None
    return (f"reshapes the shard's per-example values (shape "
            f"{rows[0].shape}) to {target}")
  made = [t for t in inputs if _leading(t) == batch and
          analysis.status(t) == tensor_kinds.NONE]
  if not made:
    return None
  return (f"joins the shard's per-example values (shape {rows[0].shape}) "
          f"with a tensor of shape {made[0].shape} in a {op_type}")


def _message(what: str, batch: int, num_towers: int) -> str:
  shard = math.ceil(batch / num_towers)
  return (
      f'The model_fn uses params["batch_size"] ({batch}, the global batch) '
      f"as a batch dimension: it {what}, but each of the {num_towers} towers "
      f"holds a shard of at most {shard} examples. params[\"batch_size\"] "
      "stays the global batch under `multi_gpu` (a loss divided by it is "
      "exact); take a batch dimension from the data instead, tf.shape(x)[0]:"
      " tf.reshape(x, [tf.shape(x)[0], ...]), "
      "cell.zero_state(tf.shape(x)[0], dtype), tf.zeros([tf.shape(x)[0], k]).")


def check_loss(tower0, params: Any, split, loss_reduction: str) -> None:
  """Warns about a loss that is a sum over the shard divided by
  `params["batch_size"]` (a share of the global batch's sum, as TPU code
  writes it) under `loss_reduction="mean"`, which would weight it by the
  tower's share nᵢ/n once more: a silently smaller loss and gradients.

  It is said, not refused: the acceptance cases users filed train it and
  let `check_towers` show the difference.
  """
  batch, loss = global_batch_param(params), tower0.spec.loss
  if (loss is None or batch is None or loss_reduction != "mean" or
      len(split.shards) < 2):
    return
  analysis = tensor_kinds.shard_analysis(split.shards[0])
  strip = shard_statistics.strip_pass_through
  op = strip(loss).op
  if op.type not in dataflow.SCALES or len(op.inputs) != 2:
    return
  total, scale = op.inputs
  value = tf.get_static_value(scale)
  if value is None or getattr(value, "ndim", 0):
    return
  divides = (op.type != "Mul" and float(value) == batch) or (
      op.type == "Mul" and math.isclose(float(value) * batch, 1.0, rel_tol=1e-6))
  shares = {strip(t).ref() for t in
            tower0.collections.get(tf.compat.v1.GraphKeys.LOSSES, [])}
  if (divides and strip(total).ref() not in shares and
      shard_statistics.statistic_kind(total, analysis) == shard_statistics.SUM):
    warn_once.warn(
        ("sum over params batch_size",),
        f"multi_gpu: the model_fn's loss is a sum over the batch divided by "
        f"params[{KEY!r}] ({batch}, the global batch): each tower's loss is "
        "then its share of the global batch's sum, which "
        "loss_reduction='mean' (the default) would weight by the tower's "
        "share of the examples once more, so the loss and gradients are not "
        "one device's. Pass multi_gpu(..., loss_reduction='sum') for this "
        "loss, or divide by the tower's own batch, tf.cast(tf.shape(x)[0], "
        "tf.float32); emg.check_towers shows the difference.")
