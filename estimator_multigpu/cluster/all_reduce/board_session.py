"""The board's session to the chief: every call bounded, a dropped session
renewed.

TensorFlow's session manager keys the sessions a server holds for other
tasks (its WorkerSessions) by the name of the master task that made them.
A master of the same name with another incarnation makes the server drop
them all ("found old WorkerSessions created by the same master task"): a
stray task of another cluster that is `/job:worker/replica:0/task:0` there
too, whose first call reaches this job's chief, or a stray chief whose
cluster lists this job's chief. Every later call of a dropped session
fails ("Session handle is not found", an `AbortedError`) while both tasks
still run, so `SideSession` makes a new session then and runs the call
again. The collectives of training hold no session and go on.

A session's first call creates its master session, which waits for the
chief's server with no deadline (a call's timeout does not cover it): a
helper thread makes that call (`connect`) and every call waits for it at
most its own timeout, so no call blocks for longer whatever the chief's
state (absent, stopped, another job's). A session is never closed in the
caller's thread: closing one whose peer went away can block.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from absl import logging
import tensorflow as tf

tf1 = tf.compat.v1
_DROPPED = "Session handle is not found"  # TensorFlow's, from the peer.


class SideSession:
  """A thread-safe session on this task's server for small calls.

  Args:
    target: this task's own server (`server.target`).
    graph: the calls' graph (finalized).
    config: the session config (its device filters).
    probe: what the first call fetches (it must run on the peer).
    timeout_secs: how long one call may take.
    peer: the peer, for the lines ("the job's board on /job:chief/...").
  """

  def __init__(self, target: str, graph: tf.Graph, config: tf1.ConfigProto,
               probe: Any, timeout_secs: float, peer: str):
    self._target, self._graph, self._config = target, graph, config
    self._probe, self._timeout, self._peer = probe, timeout_secs, peer
    self._options = tf1.RunOptions(timeout_in_ms=int(timeout_secs * 1000))
    self._lock = threading.Lock()
    self._answered = threading.Event()  # by any session, once.
    self._new_session()

  def _new_session(self) -> None:
    """A session not yet connected (call with `_lock` held, or in init)."""
    self._session = tf1.Session(self._target, graph=self._graph,
                                config=self._config)
    self._connected = threading.Event()
    self._connector: Optional[threading.Thread] = None

  @property
  def connected(self) -> bool:
    """Whether the peer answered this task once."""
    return self._answered.is_set()

  def connect(self, timeout_secs: Optional[float] = None) -> tf1.Session:
    """The current session, once its first call answered; waits for that
    at most `timeout_secs` (default: the call timeout).

    Raises:
      tf.errors.DeadlineExceededError: the peer has not answered in time.
    """
    with self._lock:
      session, connected = self._session, self._connected
      if self._connector is None:
        self._connector = threading.Thread(
            target=self._first_call, args=(session, connected), daemon=True,
            name="side-session-connect")
        self._connector.start()
    wait = self._timeout if timeout_secs is None else timeout_secs
    if not connected.wait(wait):
      raise tf.errors.DeadlineExceededError(
          None, None, f"{self._peer} has not answered within {wait:g} s")
    return session

  def _first_call(self, session: tf1.Session,
                  connected: threading.Event) -> None:
    """Creates `session`'s master session (no deadline: a helper thread)."""
    try:
      session.run(self._probe, options=self._options)
    except tf.errors.OpError:
      with self._lock:  # the next call tries again.
        if self._session is session:
          self._connector = None
      return
    self._answered.set()
    connected.set()

  def run(self, fetches: Any, feed_dict: Optional[dict] = None) -> Any:
    """`session.run(fetches, feed_dict)` within the call timeout; once
    more in a new session if the peer dropped this one.

    Raises:
      tf.errors.OpError: the peer did not answer in time, or failed.
    """
    session = self.connect()
    try:
      return session.run(fetches, feed_dict, options=self._options)
    except tf.errors.OpError as error:
      if not dropped(error):
        raise
      self._renew(session, error)
    return self.connect().run(fetches, feed_dict, options=self._options)

  def _renew(self, dropped: tf1.Session, error: tf.errors.OpError) -> None:
    """Replaces `dropped` (unless another thread did already)."""
    with self._lock:
      if self._session is not dropped:
        return
      self._new_session()
    logging.info(
        "%s dropped this task's session (%s): another task of the same "
        "name reached it (a stray of another job, refused by name), or it "
        "restarted; a new session takes over.", self._peer,
        " ".join(str(getattr(error, "message", error)).split())[-200:])
    threading.Thread(target=_close, args=(dropped,), daemon=True,
                     name="side-session-close").start()


def dropped(error: tf.errors.OpError) -> bool:
  """Whether `error` says the peer dropped the session (the peer's own
  status; a call that also waited on it may report it as cancelled)."""
  return (isinstance(error, tf.errors.AbortedError) or
          _DROPPED in str(getattr(error, "message", error)))


def _close(session: tf1.Session) -> None:
  try:
    session.close()
  except tf.errors.OpError:
    pass  # the peer had dropped it already.


def run_once(target: str, graph: tf.Graph, config: tf1.ConfigProto,
             fetch: Any, timeout_secs: float) -> Any:
  """`fetch` in a session of its own, closed after; once more if the peer
  dropped it meanwhile.

  Raises:
    tf.errors.OpError: the peer did not answer in time, or failed.
  """
  options = tf1.RunOptions(timeout_in_ms=int(timeout_secs * 1000))
  for attempt in range(2):
    with tf1.Session(target, graph=graph, config=config) as session:
      try:
        return session.run(fetch, options=options)
      except tf.errors.OpError as error:
        if attempt or not dropped(error):
          raise
  raise AssertionError("unreachable")
