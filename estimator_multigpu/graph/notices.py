"""Warnings about a model_fn, once per wrapped model_fn and mode.

A pattern `multi_gpu` cannot make exact is said once for each model built
from it: Estimator rebuilds the graph on every `train` and `evaluate` call,
and one process may wrap several model_fns (`absl.logging.log_first_n` keys
by call site instead, which silences the second model). `pipeline.build_spec`
opens `scope(model_fn, mode)` around each graph it builds; `warning` inside
it logs a message the first time its key is seen for that model_fn and mode.
Outside any scope every warning is logged.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Hashable

from absl import logging

_SEEN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_BY_ID: dict = {}  # model_fns that cannot be weakly referenced.
_STATE = threading.local()


@contextlib.contextmanager
def scope(model_fn: Any, mode: str):
  """Inside: warnings are keyed by `model_fn` and `mode`."""
  previous = getattr(_STATE, "seen", None)
  _STATE.seen = _seen_for(model_fn).setdefault(mode, set())
  try:
    yield
  finally:
    _STATE.seen = previous


def _seen_for(model_fn: Any) -> dict:
  try:
    return _SEEN.setdefault(model_fn, {})
  except TypeError:
    return _BY_ID.setdefault(id(model_fn), {})


def warning(key: Hashable, message: str, *args: Any) -> bool:
  """Logs `message % args` unless `key` was warned for this model and mode.

  Returns:
    Whether it was logged.
  """
  seen = getattr(_STATE, "seen", None)
  if seen is not None:
    if key in seen:
      return False
    seen.add(key)
  logging.warning(message, *args)
  return True
