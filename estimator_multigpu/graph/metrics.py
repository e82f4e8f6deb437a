"""EVAL metrics over the towers: one device's value on the global batch.

A metric made through an API `global_calls` wraps (`tf.compat.v1.metrics`,
Keras metrics, tf-slim, TF-Ranking, a TPUEstimatorSpec's `eval_metrics`) is
built once, in tower 0, from the global batch: its update op is the one to
run, and nothing here is inferred. What is left is metric code that builds
its own variables and assignments outside those APIs; its kind is inferred
from the graph's structure, as a last resort and with a WARNING naming the
metric (once per model_fn and mode):

- *Per-example inputs* (a hand-made total and count of the shard's
  examples): the update adds sums over the shard's examples; the towers'
  sums add up to the global batch's. Nothing to do.
- *Batch-level inputs* (one value per call, a mean over the batch on one
  device): tower i's additions to the state are weighted by its share of
  the batch, wᵢ = nᵢ / n, so the towers add Σ wᵢ·mᵢ with the weight of one
  call (Σ wᵢ = 1). An empty shard adds exactly 0 (no NaN).
- *Updates that read their own state* (running means merged Welford/Chan
  style): the towers' updates run one after another, in tower order, each
  merging its shard into the state the previous tower left.
- *Coupled inputs* (a per-example value computed from a statistic of the
  shard): each tower computes that over its own shard, which cannot be
  undone afterwards; a WARNING names the metric, the op and the fix.

How each kind is found: a metric's state variables are those its update op
assigns (the assignments a wrapped API built are not counted); a delta (the
value an assignment adds) is batch-level when what it sums holds no
per-example dimension (`tensor_kinds.ShardAnalysis`), and an update reads its
state when a delta is computed from a state variable.
"""

from __future__ import annotations

import re
from typing import Optional

from absl import logging
import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu.graph import dataflow
from estimator_multigpu.graph import tensor_kinds
from estimator_multigpu.graph import warn_once

tf1 = tf.compat.v1

_KINDS = {tensor_kinds.ROWS: "rows", tensor_kinds.STATISTIC: "batch",
          tensor_kinds.GLOBAL: "batch", tensor_kinds.NONE: None}


class MetricUpdate:
  """One tower's update op of one metric, and the state it assigns."""

  def __init__(self, update, built: frozenset = frozenset()):
    self.op = update if isinstance(update, tf.Operation) else update.op
    ancestors = dataflow.ancestors([self.op], control=True)
    self.assigns = [
        op for op in ancestors if op.type in dataflow.ASSIGNS and
        op.inputs[0].op.type in dataflow.VARIABLES and op not in built]
    self.state = {op.inputs[0].op for op in self.assigns}
    self.ancestors = ancestors

  @property
  def deltas(self) -> list:
    return [op.inputs[1] for op in self.assigns]

  def reads_state(self) -> bool:
    """Whether a delta is computed from the metric's own state."""
    return bool(dataflow.ancestors(self.deltas) & self.state)

  def kinds(self, analysis: tensor_kinds.ShardAnalysis) -> set:
    """{"rows"} (sums over examples), {"batch"}, both, or {None} (nothing
    from the shard: a constant count, which either weighting keeps)."""
    kinds = {"rows" if _sums_examples(delta, analysis) else
             _KINDS[analysis.status(_summed(delta))] for delta in self.deltas}
    return kinds - {None} or {None}

  def scale(self, share) -> bool:
    """Weights every addition by `share`; False if a delta cannot be."""
    if not all(d.dtype.is_floating for d in self.deltas):
      return False
    for assign in self.assigns:
      delta = assign.inputs[1]
      with tf.device(assign.device), tf.name_scope("tower_share"):
        weighted = tf.math.multiply_no_nan(delta, tf.cast(share, delta.dtype))
      compat.private(assign, "_update_input")(1, weighted)
    return True


def _summed(delta: tf.Tensor) -> tf.Tensor:
  """What a delta sums (the input of its reduction), or the delta itself."""
  tensor = dataflow.before(delta, dataflow.SAME_VALUES)
  if tensor.op.type in dataflow.SUMS_AND_COUNTS:
    return tensor.op.inputs[0]
  return tensor


def _sums_examples(tensor: tf.Tensor, analysis) -> bool:
  """A sum over the shard's examples, or a linear combination of such sums
  (Keras AUC adds cumulative sums of per-bucket counts, and totals minus
  them): each tower adds its shard's part, as one device adds the batch's."""
  tensor = dataflow.before(tensor, dataflow.SAME_VALUES)
  op = tensor.op
  if op.type in dataflow.SEGMENT_SUMS:
    return analysis.is_rows(op.inputs[0])
  if op.type == "Cumsum":
    return _sums_examples(op.inputs[0], analysis)
  if op.type in dataflow.LINEAR_IN_SUMS:
    return all(_sums_examples(t, analysis) for t in op.inputs)
  return (op.type in dataflow.SUMS_AND_COUNTS and
          not analysis.is_rows(tensor) and analysis.is_rows(op.inputs[0]))


def merge_eval_metric_ops(towers: list, shares: Optional[list] = None,
                          analyses: Optional[list] = None,
                          built: frozenset = frozenset()) -> dict:
  """Tower 0's metric values, with every tower's update (see module doc).

  Args:
    towers: the towers (their specs hold `eval_metric_ops`).
    shares: each tower's share of the global batch, nᵢ / n.
    analyses: each tower's `tensor_kinds.ShardAnalysis`.
    built: the ops wrapped APIs built once from the global batch.
  """
  first = towers[0].spec.eval_metric_ops or {}
  _check_same_metrics(towers, first)
  merged = {}
  for name, (value, _) in first.items():
    updates = [MetricUpdate(t.spec.eval_metric_ops[name][1], built)
               for t in towers]
    if shares and analyses and len(towers) > 1 and any(
        u.assigns for u in updates):
      _warn_inferred(name, updates[0])
      _make_exact(name, updates, shares, analyses)
    merged[name] = (value, tf.group(*{u.op: None for u in updates},
                                    name=op_name("update", name)))
  return merged


def _warn_inferred(name: str, update: MetricUpdate) -> None:
  state = sorted(op.name for op in update.state)[:3]
  warn_once.warn(
      ("inferred metric", name),
      "eval metric %r updates its own state (%s) outside the metric APIs "
      "multi_gpu builds once from the global batch, so how its towers' "
      "updates combine is inferred from its ops. Build it with "
      "tf.compat.v1.metrics, a Keras metric or a TPUEstimatorSpec's "
      "eval_metrics=(metric_fn, tensors) to make it exact by construction, "
      "or check it with emg.check_towers.", name, ", ".join(state))


def _check_same_metrics(towers: list, first: dict) -> None:
  for tower in towers[1:]:
    keys = set(tower.spec.eval_metric_ops or {})
    if keys != set(first):
      raise ValueError(
          f"Tower {tower.index} returned eval_metric_ops {sorted(keys)} but "
          f"tower 0 returned {sorted(first)}; every tower must return the "
          "same metrics.")


def op_name(prefix: str, name: str) -> str:
  """A valid op name for `prefix` + a metric name of any characters."""
  return f"{prefix}_" + re.sub(r"[^A-Za-z0-9_.\-]", "_", name)


def _make_exact(name: str, updates: list, shares: list,
                analyses: list) -> None:
  """Orders or weights the towers' updates; warns about what stays off."""
  if any(u.reads_state() for u in updates):
    _one_after_another(updates)
    return
  kinds = set().union(*(u.kinds(a) for u, a in zip(updates, analyses)))
  if kinds == {"batch"} and all(
      u.scale(share) for u, share in zip(updates, shares)):
    logging.info("eval metric %r is fed a batch-level value: each tower's "
                 "update is weighted by its share of the batch.", name)
  elif {"batch", "rows"} <= kinds:
    _warn(name, "it adds batch-level values and sums over examples at once "
          "(a scalar with per-example weights?), which no weighting of the "
          "towers makes one device's",
          "feed it per-example values and weights")
  coupling = _coupling(updates[0], analyses[0])
  if coupling is not None:
    _warn(name, f"its input couples the examples of the batch "
          f"({coupling.describe()}): each tower computes that over its own "
          "shard", COUPLING_FIX)


COUPLING_FIX = (
    "compute the batch statistic over the global batch with "
    "emg.cross_tower_sum / emg.cross_tower_concat, or pass per-example "
    "(per-list) weights instead of a default derived from the batch "
    "(TF-Ranking: a weights feature with one weight per list); "
    "emg.check_towers compares the metric to one device's")


def _coupling(update: MetricUpdate,
              analysis) -> Optional[tensor_kinds.Coupling]:
  for delta in update.deltas:
    analysis.status(delta)
  ancestors = dataflow.ancestors(update.deltas)
  return next((c for c in analysis.couplings if c.op in ancestors), None)


def _warn(name: str, problem: str, fix: str) -> None:
  warn_once.warn(("metric", name, problem),
                  "eval metric %r is not one device's over the towers: %s. "
                  "Fix: %s.", name, problem, fix)


def _one_after_another(updates: list) -> None:
  """Tower i's reads of the shared state wait for tower i-1's update."""
  for before, after in zip(updates, updates[1:]):
    done = tf.group(before.op, *before.assigns)
    others = set().union(*(u.ancestors for u in updates if u is not after))
    for op in after.ancestors - others:
      if any(t.op in after.state for t in op.inputs):
        compat.private(op, "_add_control_inputs")([done])
