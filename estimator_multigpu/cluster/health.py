"""A dead peer ends the task, within a bounded time, with one line.

In an all-reduce job every step needs every task: TensorFlow's sessions
would retry a dead peer for two hours and a collective waits for it forever.
`PeerWatch` is a health check beside training: every `interval_secs` it
opens a TCP connection to each peer's gRPC address; a peer that has not
answered for `timeout_secs` (default 120 s, never started or gone) is
reported in one ERROR line naming the task, and the process exits with
status 1 at once (TensorFlow's teardown of a server whose peers are gone can
hang). It never limits how long a step may take.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from typing import Callable, Optional

from absl import logging

DEFAULT_TIMEOUT_SECS = 120.0


class PeerWatch:
  """Watches the peers' addresses while a task trains (a context manager).

  Args:
    peers: {task name: "host:port"} of every other training task.
    timeout_secs: how long a peer may not answer before the task ends.
    interval_secs: seconds between checks.
    on_dead: called with the message instead of exiting (tests).
  """

  def __init__(self, peers: dict, timeout_secs: float = DEFAULT_TIMEOUT_SECS,
               interval_secs: float = 2.0,
               on_dead: Optional[Callable[[str], None]] = None):
    if not timeout_secs > 0:
      raise ValueError(f"`peer_timeout_secs` is {timeout_secs!r}; expected "
                       "a positive number of seconds, e.g. 120.")
    self._peers = dict(peers)
    self._timeout = timeout_secs
    self._interval = min(interval_secs, timeout_secs / 4)
    self._on_dead = on_dead or _exit
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._watch, daemon=True,
                                    name="peer-watch")

  def __enter__(self) -> "PeerWatch":
    self._thread.start()
    return self

  def __exit__(self, *exc_info) -> None:
    self._stop.set()

  def _watch(self) -> None:
    last_seen = {name: time.monotonic() for name in self._peers}
    while not self._stop.wait(self._interval):
      for name, address in self._peers.items():
        if answers(address, timeout_secs=self._interval):
          last_seen[name] = time.monotonic()
        elif time.monotonic() - last_seen[name] > self._timeout:
          self._on_dead(
              f"task {name} ({address}) has not answered for "
              f"{self._timeout:.0f} s: it died or never started; this task "
              "ends. Restart every task of the job: training resumes from "
              "the chief's last checkpoint.")
          return


def answers(address: str, timeout_secs: float) -> bool:
  """Whether a TCP connection to `address` ("host:port") opens."""
  host, port = address.rsplit(":", 1)
  try:
    with socket.create_connection((host.strip("[]"), int(port)),
                                  timeout=timeout_secs):
      return True
  except OSError:
    return False


def _exit(message: str) -> None:
  logging.error("%s", message)
  sys.stderr.flush()
  sys.stdout.flush()
  os._exit(1)  # pylint: disable=protected-access
