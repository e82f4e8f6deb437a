"""A job's notice board: small JSON entries kept on the chief's server.

The tasks of an all-reduce job have no ps to hold their control queues, but
every task's gRPC server runs ops for the others. The board is one table
(a `MutableHashTable` with a shared name, int64 key -> JSON text) on the
chief's CPU; every task writes its own entries into it and reads them all
through a side session on the chief's own server (`board_session`: each
call bounded by a timeout, a dropped session renewed).
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
from typing import Optional

from absl import logging
import tensorflow as tf

from estimator_multigpu.cluster.all_reduce import board_entries
from estimator_multigpu.cluster.all_reduce import board_session

tf1 = tf.compat.v1

SHARED_NAME = "estimator_multigpu_board"
TWIN_PREFIX = "second/"  # a second task of a live task's name, refused.
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
  """This task's handle on the board (thread-safe).

  Its calls go through a `board_session.SideSession`: each waits at most
  its timeout, and a session the chief's server dropped is renewed. Its
  target is the chief's server itself (`grpc://<chief's address>`): the
  chief's master then runs every call, so no session of this task's own
  master reaches the chief, where a stray of this task's name (its own
  master, another incarnation) would make the chief's server drop it.
  Any other target (this task's own server) works too, only less
  sheltered.

  Args:
    target: the server whose master runs the calls (the chief's).
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
    self._target = target
    self._config = tf1.ConfigProto(device_filters=[chief_device])
    self._session = board_session.SideSession(
        target, graph, self._config, self._export, timeout_secs,
        f"the job's board on {chief_device}")
    self._timeout, self.chief_device = timeout_secs, chief_device
    self._seal, self._me = board_entries.JobSeal(token), (me, started)
    self.started = started
    self._is_chief = own_device == chief_device
    self.foreign: set = set()  # board_entries.Foreign seen so far.
    self._twins: set = set()  # this job's second tasks named so far.

  @property
  def connected(self) -> bool:
    """Whether the chief's server answered this task's board once."""
    return self._session.connected

  def connect(self, timeout_secs: Optional[float] = None) -> None:
    """Waits until the chief's server answered (the first call made),
    at most `timeout_secs` (default: the call timeout).

    Raises:
      tf.errors.DeadlineExceededError: it has not answered in time.
    """
    self._session.connect(timeout_secs)

  def post(self, name: str, entry: dict) -> None:
    """Writes (replaces) entry `name`.

    Raises:
      tf.errors.OpError: the chief's server did not answer in time.
    """
    text = self._seal.seal(name, entry, *self._me)
    self._session.run(self._insert, {self._key: self._table_key(name),
                                     self._value: text})

  def notify(self, name: str, entry: dict) -> None:
    """Writes entry `name` from a graph of constants, with no feed, in a
    session of its own: a stray's note, which works whatever the board's
    target (through this task's own server, `post`'s feeds would fail
    from a task the chief does not know: the chief resolves its device
    name to another process).

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
    board_session.run_once(self._target, graph, self._config, insert,
                           self._timeout)

  def _table_key(self, name: str) -> int:
    return table_key(self._seal.key_name(name))

  def get(self, name: str) -> Optional[dict]:
    """Entry `name`, or None (one small call: for every step).

    Raises:
      tf.errors.OpError: the chief's server did not answer in time.
    """
    text = self._session.run(self._find, {self._key: self._table_key(name)})
    opened = self._seal.open(text) if text else None
    return opened[1] if isinstance(opened, tuple) else None

  def read(self, prefix: Optional[str] = None) -> dict:
    """{name: entry} of every entry (whose name starts with `prefix`).

    Raises:
      tf.errors.OpError: the chief's server did not answer in time.
    """
    texts = self._session.run(self._export)
    entries, foreign = board_entries.opened_entries(self._seal, texts, prefix)
    for stray in sorted(foreign - self.foreign, key=str):
      self.foreign.add(stray)
      if self._is_chief:
        logging.warning(
            "A task of another job (%s; its board entries are not signed "
            "with this job's token) reached this chief; it is refused and "
            "this job trains on. Check the addresses (--worker_hosts / "
            "TF_CONFIG) and EMG_JOB_TOKEN given to each job.", stray.name)
    if self._is_chief:
      self._name_twins(entries)
    return entries

  def _name_twins(self, entries: dict) -> None:
    """Names, once, each second task of this job's token that found its
    name taken by a live task and ended (`strays.refuse_twin`)."""
    for key, entry in sorted(entries.items()):
      twin = (key, entry.get("as"), entry.get("live"))
      if key.startswith(TWIN_PREFIX) and twin not in self._twins:
        self._twins.add(twin)
        logging.warning(
            "A second %s (%s) with this job's token reached this chief "
            "while %s trains in this job; it is refused and this job "
            "trains on. Check the addresses (--worker_hosts / TF_CONFIG) "
            "given to each task.", key[len(TWIN_PREFIX):], twin[1], twin[2])
