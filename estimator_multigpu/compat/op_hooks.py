"""The package's one TensorFlow op callback, and the hooks it runs in order.

TensorFlow's op callbacks (`tensorflow.python.framework.op_callbacks`,
private) see every op a graph builds through Python; a callback that returns
tensors replaces the op's outputs for everything built afterwards. They
chain, and a `None` return drops an earlier callback's replacement, so the
package registers exactly one (`_dispatch`) and runs its hooks through it,
in the order of `HOOK_ORDER` (check_towers' fixed random draws, then the
empty-shard guards, then the global batch's rewrite): each hook gets the
outputs as the hooks before it left them (`outputs`) and the op as
TensorFlow built it (`original_op()`); a hook returns replacement outputs or
None to keep them.

Gradient construction is never hooked: while `tf.gradients` or a graph-mode
`tf.GradientTape` builds gradients (`building_gradients()`), no hook runs.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Callable, Optional

from estimator_multigpu.compat import internals

HOOK_ORDER = ("fixed_random", "empty_shards", "global_batch")
NO_OUTPUT_HOOKS = ("global_batch",)  # also see ops without outputs (writes).
_LOCK = threading.RLock()
_PATCHES = [0]  # threads with active hooks (the gradient patch is global).
_STATE = threading.local()  # TensorFlow's op callbacks are per thread too.


def _active() -> dict:
  """This thread's hooks: name -> [hook, depth]."""
  if not hasattr(_STATE, "active"):
    _STATE.active = {}
  return _STATE.active


@contextlib.contextmanager
def installed(name: str, hook: Callable):
  """Runs `hook` (named in `HOOK_ORDER`) on every op this thread builds
  inside; scopes of one name nest."""
  if name not in HOOK_ORDER:
    raise ValueError(f"op hook {name!r} is not one of {HOOK_ORDER}.")
  active = _active()
  if not active:
    _install()
  entry = active.setdefault(name, [hook, 0])
  entry[1] += 1
  try:
    yield
  finally:
    active[name][1] -= 1
    if not active[name][1]:
      del active[name]
    if not active:
      _uninstall()


def original_op():
  """The op TensorFlow built, inside a hook (before any replacement)."""
  return getattr(_STATE, "op", None)


def building_gradients() -> bool:
  """Whether this thread is inside `tf.gradients` or `GradientTape.gradient`."""
  return getattr(_STATE, "gradients", 0) > 0


def _dispatch(op_type, inputs, attrs, outputs, op_name=None, graph=None):
  """The registered callback: the active hooks in `HOOK_ORDER`."""
  if building_gradients():
    return None
  active = _active()
  hooks = [active[n][0] for n in HOOK_ORDER if n in active and (
      outputs or n in NO_OUTPUT_HOOKS)]
  if not hooks:
    return None
  _STATE.op = outputs[0].op if outputs else graph.get_operation_by_name(
      op_name)
  current, replaced = outputs, False
  try:
    for hook in hooks:
      result = hook(op_type, inputs, attrs, current, op_name=op_name,
                    graph=graph)
      if result is not None:
        current, replaced = result, True
  finally:
    _STATE.op = None
  return current if replaced else None


def _counting(fn: Callable) -> Callable:
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    _STATE.gradients = getattr(_STATE, "gradients", 0) + 1
    try:
      return fn(*args, **kwargs)
    finally:
      _STATE.gradients -= 1
  wrapped.estimator_multigpu_original = fn
  return wrapped


_PATCHED = (("gradients_util", "_GradientsHelper"),
            ("imperative_grad", "imperative_grad"))


def _install() -> None:
  with _LOCK:
    _PATCHES[0] += 1
    if _PATCHES[0] == 1:
      for key, name in _PATCHED:
        module = internals.internal(key)
        setattr(module, name, _counting(getattr(module, name)))
  internals.internal("op_callbacks").add_op_callback(_dispatch)


def _uninstall() -> None:
  internals.internal("op_callbacks").remove_op_callback(_dispatch)
  with _LOCK:
    _PATCHES[0] -= 1
    if _PATCHES[0]:
      return
    for key, name in _PATCHED:
      module = internals.internal(key)
      patched = getattr(module, name)
      setattr(module, name,
              getattr(patched, "estimator_multigpu_original", patched))


def hooks_active() -> Optional[tuple]:
  """The names of the active hooks (tests)."""
  return tuple(n for n in HOOK_ORDER if n in _active()) or None
