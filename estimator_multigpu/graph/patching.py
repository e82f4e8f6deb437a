"""A module patch installed while any scope that needs it is open.

Synchronized batch norm (`layers`) and the global-batch `tf.compat.v1.losses` (`v1_losses`)
change TensorFlow's functions only while towers are being built. Scopes
nest and may overlap (several graphs, several threads): the patch goes in
when the first scope opens and comes out when the last one closes.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable


class Patch:
  """`install` on the first open scope, `uninstall` after the last."""

  def __init__(self, install: Callable[[], None],
               uninstall: Callable[[], None]):
    self._install = install
    self._uninstall = uninstall
    self._lock = threading.RLock()
    self._depth = 0

  @property
  def installed(self) -> bool:
    return self._depth > 0

  @contextlib.contextmanager
  def scope(self):
    """Inside, the patch is installed."""
    with self._lock:
      self._depth += 1
      if self._depth == 1:
        self._install()
    try:
      yield
    finally:
      with self._lock:
        self._depth -= 1
        if self._depth == 0:
          self._uninstall()
