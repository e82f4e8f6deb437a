"""What a session can run of a model_fn's graph.

A session runs what the spec holds (train_op, loss, predictions, metrics),
what its hooks hold (their attributes: a hook's own train op) and what the
graph's collections hold (summaries, UPDATE_OPS, ...), and every op those
read or wait on. An op none of them reaches is never run: a Keras layer's
`updates` the model_fn left alone. `run_by_nothing` finds such ops among
the ones it is given (for `state_updates`, whose warnings are about writes
that run).
"""

from __future__ import annotations

from typing import Any, Iterable

import tensorflow as tf

# Ops visited per op before assuming it may run (the walk gives up).
_FORWARD_LIMIT = 4000


def run_by_nothing(ops: Iterable[tf.Operation], spec: Any,
                   collections: dict) -> set:
  """The ops of `ops` no op the spec, a hook of it or a collection (the
  graph's, and `collections`: a tower's own) holds reads or waits on,
  however indirectly."""
  ops = list(ops)
  if not ops:
    return set()
  graph = ops[0].graph
  waiting: dict = {}
  for op in graph.get_operations():
    for control in op.control_inputs:
      waiting.setdefault(control, []).append(op)
  held = _held_ops(graph, spec, collections)
  return {op for op in ops if not _reaches(op, held, waiting)}


def _reaches(op: tf.Operation, held: set, waiting: dict) -> bool:
  """Whether an op of `held` reads `op` or waits on it (or may: the walk
  gave up)."""
  seen, stack = {op}, [op]
  while stack:
    current = stack.pop()
    if current in held or len(seen) > _FORWARD_LIMIT:
      return True
    for after in [c for t in current.outputs for c in t.consumers()] + (
        waiting.get(current, [])):
      if after not in seen:
        seen.add(after)
        stack.append(after)
  return False


def _held_ops(graph: tf.Graph, spec: Any, collections: dict) -> set:
  """The ops the spec, its training hooks (their attributes) and the
  collections hold."""
  items = [spec.train_op, spec.loss, spec.predictions, spec.eval_metric_ops]
  for hook in list(spec.training_hooks) + list(spec.training_chief_hooks):
    items += list(vars(hook).values())
  for key in graph.get_all_collection_keys():
    items += graph.get_collection(key)
  items += list(collections.values())
  ops = [leaf if isinstance(leaf, tf.Operation) else getattr(leaf, "op", None)
         for leaf in _leaves(items, depth=4)]  # tensors, lazy reads.
  return {op for op in ops if isinstance(op, tf.Operation)}


def _leaves(item: Any, depth: int) -> list:
  """The leaves of nested lists, tuples and dicts (values), `depth` deep."""
  if isinstance(item, dict):
    item = list(item.values())
  if not isinstance(item, (list, tuple)) or depth == 0:
    return [item]
  return [leaf for part in item for leaf in _leaves(part, depth - 1)]
