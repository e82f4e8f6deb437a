"""A job's notice board: small JSON entries kept on the chief's server.

The tasks of an all-reduce job have no ps to hold their control queues, but
every task's gRPC server runs ops for the others. The board is one table
(a `MutableHashTable` with a shared name, int64 key -> JSON text) on the
chief's CPU; every task writes its own entries into it and reads them all
through a side session on its own server, each call bounded by a timeout.
It carries what must not wait on a collective: each task's heartbeat and
step count (`heartbeat`), the settings the tasks compare before their first
step (`agreement`), and why a task ended.

An entry is named (`beat/worker:0`) and sealed with the job token
(`board_entries`): its table key is a stable 64-bit hash of the job's id
and the name (the table has no string -> string kernel), and it carries an
HMAC keyed by the token. A task reads only its own job's entries; another
job's (a stray task that reached this chief) are collected as `foreign`,
and the chief names each once in a WARNING.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Optional

from absl import logging
import tensorflow as tf

from estimator_multigpu.cluster.all_reduce import board_entries

tf1 = tf.compat.v1

SHARED_NAME = "estimator_multigpu_board"
TIMEOUT_SECS = 5.0


def _table() -> tf.Tensor:
  """The board's table (on the device in scope), by its shared name."""
  return tf.raw_ops.MutableHashTableV2(
      key_dtype=tf.int64, value_dtype=tf.string, shared_name=SHARED_NAME,
      use_node_name_sharing=False)


def table_key(name: str) -> int:
  """The table's key of entry `name`: a stable, positive 63-bit hash."""
  return int.from_bytes(hashlib.sha1(name.encode()).digest()[:8],
                        "big") >> 1


class Board:
  """This task's handle on the board (thread-safe; never closed: a session
  on a peer that went away can block in `close`).

  The session's first call creates its master session, which waits for the
  chief's server with no deadline (the call's timeout does not cover it):
  a helper thread makes that call (`connect`), and every read or write
  waits for it at most its own timeout, so no call blocks for longer
  whatever the chief's state (absent, stopped, another job's).

  Args:
    target: this task's own server (`server.target`).
    own_device: this task (`/job:worker/replica:0/task:0`).
    chief_device: the chief task, which holds the table.
    timeout_secs: how long one read or write may take.
    token: the job token (seals the entries).
    me: this task ("worker:0") and `started`: how it was started (its
      address too), as its entries say who posted them.
  """

  def __init__(self, target: str, own_device: str, chief_device: str,
               timeout_secs: float = TIMEOUT_SECS, token: str = "(none)",
               me: str = "?", started: str = "?"):
    graph = tf.Graph()
    with graph.as_default(), tf.device(f"{chief_device}/device:CPU:0"):
      table = _table()
      self._key = tf1.placeholder(tf.int64, [])
      self._value = tf1.placeholder(tf.string, [])
      self._insert = tf.raw_ops.LookupTableInsertV2(
          table_handle=table, keys=self._key, values=self._value)
      self._find = tf.raw_ops.LookupTableFindV2(
          table_handle=table, keys=self._key, default_value="")
      self._export = tf.raw_ops.LookupTableExportV2(
          table_handle=table, Tkeys=tf.int64, Tvalues=tf.string)[1]
    graph.finalize()
    config = tf1.ConfigProto(device_filters=sorted({own_device,
                                                    chief_device}))
    self._session = tf1.Session(target, graph=graph, config=config)
    self._target, self._config = target, config
    self._options = tf1.RunOptions(timeout_in_ms=int(timeout_secs * 1000))
    self._timeout, self.chief_device = timeout_secs, chief_device
    self._connected = threading.Event()
    self._connecting = threading.Lock()
    self._connector: Optional[threading.Thread] = None
    self._seal, self._me = board_entries.JobSeal(token), (me, started)
    self._is_chief = own_device == chief_device
    self.foreign: set = set()  # board_entries.Foreign seen so far.

  @property
  def connected(self) -> bool:
    """Whether the chief's server answered this task's board once."""
    return self._connected.is_set()

  def connect(self, timeout_secs: Optional[float] = None) -> None:
    """Waits until the chief's server answered (the first call made),
    at most `timeout_secs` (default: the call timeout).

    Raises:
      tf.errors.DeadlineExceededError: it has not answered in time.
    """
    with self._connecting:
      if self._connector is None:
        self._connector = threading.Thread(target=self._first_call,
                                           daemon=True, name="board-connect")
        self._connector.start()
    wait = self._timeout if timeout_secs is None else timeout_secs
    if not self._connected.wait(wait):
      raise tf.errors.DeadlineExceededError(
          None, None, f"the job's board on {self.chief_device} has not "
          f"answered within {wait:g} s")

  def _first_call(self) -> None:
    """Creates the master session (no deadline: a helper thread)."""
    try:
      self._session.run(self._export, options=self._options)
    except tf.errors.OpError:
      with self._connecting:  # the next call tries again.
        self._connector = None
      return
    self._connected.set()

  def post(self, name: str, entry: dict) -> None:
    """Writes (replaces) entry `name`.

    Raises:
      tf.errors.OpError: the chief's server did not answer in time.
    """
    text = self._seal.seal(name, entry, *self._me)
    self.connect()
    self._session.run(self._insert, {self._key: self._table_key(name),
                                     self._value: text},
                      options=self._options)

  def notify(self, name: str, entry: dict) -> None:
    """Writes entry `name` from a graph of constants, with no feed: from a
    task the chief does not know (another job's, whose own device name
    the chief resolves to another process), `post`'s feeds would fail.

    Raises:
      tf.errors.OpError: the chief's server did not answer in time.
    """
    self.connect()
    graph = tf.Graph()
    with graph.as_default(), tf.device(f"{self.chief_device}/device:CPU:0"):
      insert = tf.raw_ops.LookupTableInsertV2(
          table_handle=_table(), keys=tf.constant(self._table_key(name),
                                                  tf.int64),
          values=tf.constant(self._seal.seal(name, entry, *self._me)))
    with tf1.Session(self._target, graph=graph,
                     config=self._config) as session:
      session.run(insert, options=self._options)

  def _table_key(self, name: str) -> int:
    return table_key(self._seal.key_name(name))

  def get(self, name: str) -> Optional[dict]:
    """Entry `name`, or None (one small call: for every step).

    Raises:
      tf.errors.OpError: the chief's server did not answer in time.
    """
    self.connect()
    text = self._session.run(self._find, {self._key: self._table_key(name)},
                             options=self._options)
    opened = self._seal.open(text) if text else None
    return opened[1] if isinstance(opened, tuple) else None

  def read(self, prefix: Optional[str] = None) -> dict:
    """{name: entry} of every entry (whose name starts with `prefix`).

    Raises:
      tf.errors.OpError: the chief's server did not answer in time.
    """
    self.connect()
    texts = self._session.run(self._export, options=self._options)
    entries, foreign = board_entries.opened_entries(self._seal, texts, prefix)
    for stray in sorted(foreign - self.foreign, key=str):
      self.foreign.add(stray)
      if self._is_chief:
        logging.warning(
            "A task of another job (%s; its board entries are not signed "
            "with this job's token) reached this chief; it is refused and "
            "this job trains on. Check the addresses (--worker_hosts / "
            "TF_CONFIG) and EMG_JOB_TOKEN given to each job.", stray.name)
    return entries
