"""Warnings said once per model built: per wrapped model_fn and mode.

Estimator builds a graph each time it trains, evaluates or predicts, and a
`multi_gpu` wrapper builds several towers per graph, so a warning found
while building would repeat. `warn` says each topic once per wrapped
model_fn and mode (`model_scope`, which the wrapper enters around each
build): a second model with the same problem is warned about again, the
same model's next `train` call is not. Outside a `model_scope` (a helper
called on its own) a topic is said once per graph.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional
import weakref

from absl import logging
import tensorflow as tf

# Per wrapped model_fn (or graph, outside a model_scope; weakly held), per
# mode: the topics already said.
_SAID: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_current: Optional[set] = None


@contextlib.contextmanager
def model_scope(wrapped_model_fn: Callable, mode: Any):
  """Warnings inside are said once per `wrapped_model_fn` and `mode`."""
  global _current
  previous = _current
  _current = _SAID.setdefault(wrapped_model_fn, {}).setdefault(str(mode),
                                                              set())
  try:
    yield
  finally:
    _current = previous


def warn(topic: str, message: str, *args) -> bool:
  """Logs `message % args` as a WARNING unless `topic` was said already for
  this model and mode. Returns whether it was logged."""
  said = _current if _current is not None else _SAID.setdefault(
      tf.compat.v1.get_default_graph(), {}).setdefault("", set())
  if topic in said:
    return False
  said.add(topic)
  logging.warning(message, *args)
  return True
