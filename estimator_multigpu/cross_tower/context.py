"""Which tower is being built, and with which group of towers.

`multi_gpu` enters `tower_context` around every tower of a graph with more
than one tower (`scope_factory`), so code inside the model_fn can talk to
the other towers (`losses`, `moments`). Contexts are per thread and per graph.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Optional

import tensorflow as tf

from estimator_multigpu import collectives

tf1 = tf.compat.v1
_STACK = threading.local()


@dataclasses.dataclass(frozen=True)
class TowerContext:
  """The tower being built and its group.

  Attributes:
    tower_index: the tower's position in `group.devices`.
    group: every tower of the graph.
    graph: the graph the tower is built in.
    loss_weight: the tower's share of the global batch (wᵢ), which its
      gradients are multiplied by (`collectives.all_reduce_sum`).
    synchronize_moments: whether batch-norm moments reduce over the group
      (`multi_gpu(sync_batch_norm=True)` in TRAIN).
    examples: the tower's examples (int, or a scalar tensor at run time);
      None when unknown.
    example_shares: whether `loss_weight` is the tower's share of the
      examples, nᵢ/n (`loss_reduction="mean"`).
  """
  tower_index: int
  group: collectives.Group
  graph: tf.Graph
  loss_weight: Any = None
  synchronize_moments: bool = False
  examples: Any = None
  example_shares: bool = False

  @property
  def device(self) -> str:
    return self.group.devices[self.tower_index]


def current(synchronize_moments: bool = False) -> Optional[TowerContext]:
  """The innermost context of this thread and the default graph (with
  `synchronize_moments`: the innermost that synchronizes moments). Inside
  a function body (a `tf.cond` branch, a `tf.while_loop` body) it is the
  context of the graph around it."""
  graphs = [tf1.get_default_graph()]
  while getattr(graphs[-1], "outer_graph", None) is not None:
    graphs.append(graphs[-1].outer_graph)
  for context in reversed(getattr(_STACK, "contexts", [])):
    if any(context.graph is g for g in graphs) and (
        context.synchronize_moments or not synchronize_moments):
      return context
  return None


@contextlib.contextmanager
def tower_context(tower_index: int, group: collectives.Group,
                  loss_weight: Any = None, synchronize_moments: bool = False,
                  **details):
  """Makes the cross-tower operations inside reduce over `group`'s towers.

  `details`: `examples` and `example_shares` (see `TowerContext`); by
  default those of the enclosing context of the same tower.
  """
  if not 0 <= tower_index < group.num_towers:
    raise ValueError(f"`tower_index` is {tower_index}; expected one of "
                     f"0..{group.num_towers - 1} for {group.devices}.")
  outer = current()
  if not details and outer is not None and outer.tower_index == tower_index:
    details = dict(examples=outer.examples,
                   example_shares=outer.example_shares)
  context = TowerContext(tower_index, group, tf1.get_default_graph(),
                         loss_weight, synchronize_moments, **details)
  _STACK.contexts = getattr(_STACK, "contexts", []) + [context]
  try:
    yield context
  finally:
    _STACK.contexts = [c for c in _STACK.contexts if c is not context]


def scope_factory(group: collectives.Group, sizes=None,
                  example_shares: bool = False):
  """The `towers.build_towers` scope factory for the towers of `group`.

  Args:
    group: the collective group; tower i of this graph is
      `group.first_local + i`.
    sizes: every tower's examples (`splitting.Split.sizes`), or None.
    example_shares: whether the towers' loss weights are nᵢ/n.

  After the last tower, checks that every tower built the same all-reduces
  (`collectives.check_complete`): a mismatch would hang the first step.
  """
  @contextlib.contextmanager
  def scope(tower):
    index = group.first_local + tower.index
    with tower_context(index, group, tower.loss_weight,
                       examples=sizes[tower.index] if sizes else None,
                       example_shares=example_shares):
      yield
    if index == group.last_local:
      collectives.check_complete()

  return scope
