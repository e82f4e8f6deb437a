"""The board's entries, sealed with the job token.

Every task of a job shares a job token (`EMG_JOB_TOKEN`, which the launcher
sets; "(none)" without it). An entry's table key is a hash of the job's id
(a hash of the token) and the entry's name, so a task of another job (another
token) never overwrites this job's entries, and every entry carries an
HMAC-SHA256 keyed by the token, so a task ignores whatever fails it. The
token itself is never written to the board. Each entry also names, in
clear, the task that posted it (`from`: "chief:0"; `as`: how it was
started, its address): a foreign entry is named in the lines that refuse
it (`Foreign`), never trusted.

A guard against mistakes, not an authentication: anyone who reaches a
task's port can run any graph in its process, environment included.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from typing import Optional, Union


@dataclasses.dataclass(frozen=True)
class Foreign:
  """An entry that is not this job's: its job id, the task it claims to
  be ("chief:0") and how that task says it was started."""
  job: str
  task: str
  name: str


class JobSeal:
  """Seals and opens one job's entries.

  Args:
    token: the job token.
  """

  def __init__(self, token: str):
    self._key = token.encode()
    self.job = hashlib.sha256(b"emg-board/" + self._key).hexdigest()[:16]

  def key_name(self, name: str) -> str:
    """What the table's key hashes: the job's id and the entry's name."""
    return f"{self.job}/{name}"

  def seal(self, name: str, entry: dict, task: str, started: str) -> str:
    """The stored text of entry `name`, posted by `task` (`started`: how
    it was started)."""
    body = _canonical({"job": self.job, "key": name, "entry": entry})
    return json.dumps({"job": self.job, "key": name, "entry": entry,
                       "from": task, "as": started, "mac": self._mac(body)},
                      sort_keys=True)

  def open(self, text: bytes) -> Union[tuple, Foreign, None]:
    """(name, entry) of this job's entry; `Foreign` for another job's (or
    one that fails the HMAC); None for unreadable text."""
    try:
      sealed = json.loads(text)
      body = _canonical({key: sealed[key] for key in ("job", "key",
                                                      "entry")})
    except (ValueError, KeyError, TypeError):
      return None
    if sealed["job"] != self.job or not hmac.compare_digest(
        str(sealed.get("mac")), self._mac(body)):
      return Foreign(str(sealed["job"]), str(sealed.get("from", "?")),
                     str(sealed.get("as", "?")))
    return sealed["key"], sealed["entry"]

  def _mac(self, body: str) -> str:
    return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()


def _canonical(value: dict) -> str:
  return json.dumps(value, sort_keys=True, separators=(",", ":"))


def opened_entries(seal: JobSeal, texts, prefix: Optional[str]) -> tuple:
  """({name: entry} of this job's entries under `prefix`, {Foreign})."""
  entries, foreign = {}, set()
  for text in texts:
    opened = seal.open(text)
    if isinstance(opened, Foreign):
      foreign.add(opened)
    elif opened is not None and (prefix is None or
                                 opened[0].startswith(prefix)):
      entries[opened[0]] = opened[1]
  return entries, foreign
