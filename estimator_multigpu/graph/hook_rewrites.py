"""Where hooks read: their attributes, and what `before_run` asks for.

Every training, evaluation and prediction hook of tower 0 fetches the global
batch's values (`hook_fetches` pairs and combines them):

1. when the graph is built, the hook's attributes that hold a tower-0 tensor
   or its name (directly, or one level deep in a dict, list or tuple:
   `LoggingTensorHook`, a custom hook keeping `self.tensor`) are replaced by
   the global tensor, and a scalar summary op a hook holds
   (`SummarySaverHook`) reads the combined scalar;
2. at run time (the graph is final), the hook's `before_run` and
   `after_run` are wrapped on the instance (its class and identity stay the
   user's): the fetches `before_run` returns are extended with every tower's
   counterpart, and `after_run` receives the combined values.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from estimator_multigpu.graph import dataflow
from estimator_multigpu.graph import hook_fetches
from estimator_multigpu.graph import state_updates

tf1 = tf.compat.v1
GlobalFetches = hook_fetches.GlobalFetches


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
    peers = state_updates.peer_collectives(dataflow.ancestors(
        [tensor], control=True, per_output=True))
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

  def _pairing(self, leaf, graph, what: str) -> Optional[hook_fetches.Pairing]:
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

