"""A dead peer ends the task, within a bounded time, with one line.

In an all-reduce job every step needs every task: TensorFlow's sessions
would retry a dead peer for two hours and a collective waits for it forever.
`PeerWatch` is a health check beside training: every `interval_secs` it
opens a TCP connection to each peer's gRPC address. A peer that has not
answered for `timeout_secs` (default 120 s: never started, or unreachable),
or that answered before and now refuses connections twice in a row (its
process is gone, its host is up), is reported in one ERROR line naming the
task (one that never answered: with where this task's cluster came from,
a TF_CONFIG left in the shell perhaps), and the process exits with status
1 at once (TensorFlow's teardown of a server whose peers are gone can
hang). It never limits how long a step may take. A step that fails because
a peer is gone (TensorFlow raises before the timeout) ends the same way,
with the same line (`end_if_a_peer_is_gone`).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable, Optional

from absl import logging

from estimator_multigpu.runtime import process_exit

DEFAULT_TIMEOUT_SECS = 120.0
ANSWERS, REFUSED, SILENT = "answers", "refused", "silent"
_REFUSALS = 2  # refused probes in a row that end a peer that answered.


class PeerWatch:
  """Watches the peers' addresses while a task trains (a context manager).

  Args:
    peers: {task name: "host:port"} of every other training task.
    timeout_secs: how long a peer may not answer before the task ends.
    interval_secs: seconds between checks.
    on_dead: called with the message instead of exiting (tests).
    hint: what ends the line of a peer that never answered (where the
      cluster came from, `cluster.source`).
  """

  def __init__(self, peers: dict, timeout_secs: float = DEFAULT_TIMEOUT_SECS,
               interval_secs: float = 1.0,
               on_dead: Optional[Callable[[str], None]] = None,
               hint: str = ""):
    if not timeout_secs > 0:
      raise ValueError(f"`peer_timeout_secs` is {timeout_secs!r}; expected "
                       "a positive number of seconds, e.g. 120.")
    self._peers = dict(peers)
    self._timeout = timeout_secs
    self._interval = min(interval_secs, timeout_secs / 4)
    self._on_dead, self._hint = on_dead or _exit, hint
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._watch, daemon=True,
                                    name="peer-watch")

  def __enter__(self) -> "PeerWatch":
    self._thread.start()
    return self

  def __exit__(self, *exc_info) -> None:
    self._stop.set()

  def end_if_a_peer_is_gone(self) -> None:
    """After a failed step: a peer that does not answer now ends the task
    with the one line, before TensorFlow's teardown (which can abort)."""
    gone = [name for name, address in self._peers.items()
            if probe(address, timeout_secs=self._interval) != ANSWERS]
    if gone:
      self._gone(gone[0])

  def _watch(self) -> None:
    last_seen = {name: None for name in self._peers}
    refused = {name: 0 for name in self._peers}
    start = time.monotonic()
    while not self._stop.wait(self._interval):
      for name, address in self._peers.items():
        state = probe(address, timeout_secs=self._interval)
        if state == ANSWERS:
          last_seen[name], refused[name] = time.monotonic(), 0
          continue
        refused[name] = refused[name] + 1 if state == REFUSED else 0
        if self._dead(last_seen[name], refused[name], start):
          if last_seen[name] is None:
            self._never_came(name)
          else:
            self._gone(name)
          return

  def _dead(self, last_seen, refusals: int, start: float) -> bool:
    """Silent past the timeout; or, having answered before, refusing
    connections twice in a row (its process is gone: no need to wait)."""
    silent = time.monotonic() - (last_seen or start)
    return silent > self._timeout or (last_seen is not None and
                                       refusals >= _REFUSALS)

  def _gone(self, name: str) -> None:
    self._on_dead(f"task {name} ({self._peers[name]}) does not answer: it "
                  "died or never started; this task ends. Restart every "
                  "task of the job: training resumes from the chief's last "
                  "checkpoint.")

  def _never_came(self, name: str) -> None:
    self._on_dead(f"task {name} ({self._peers[name]}) does not answer, and "
                  f"has not since this task started {self._timeout:g} s ago "
                  "(--peer_timeout_secs): it was never started, or its "
                  f"address is wrong; this task ends. {self._hint}".strip())


def probe(address: str, timeout_secs: float) -> str:
  """Whether a TCP connection to `address` ("host:port") opens: ANSWERS,
  REFUSED (nothing listens: the process is gone) or SILENT."""
  host, port = address.rsplit(":", 1)
  try:
    with socket.create_connection((host.strip("[]"), int(port)),
                                  timeout=timeout_secs):
      return ANSWERS
  except ConnectionRefusedError:
    return REFUSED
  except OSError:
    return SILENT


def _exit(message: str) -> None:
  logging.error("%s", message)
  process_exit.exit_now(1)
