"""One writer per model dir: a lock file that names the run holding it.

Two trainings writing one model dir overwrite each other's checkpoints and
`run_config.json`, and the second "resumes" from what the first just saved.
`hold(model_dir)` creates `<model_dir>/train.lock` atomically (`O_EXCL`)
holding the owner's host, PID and job, refreshes it every
`HEARTBEAT_SECS` while training runs, and removes it at the end (also
at an immediate exit, `release_held`):

- held by a live process on this host: `ModelDirLockedError` naming host
  and PID and the fix (wait, stop it, or choose another model dir) — also
  when it is the same cluster job (a duplicate launch): the addresses
  prove nothing about who is alive;
- held on another host with a fresh heartbeat (a chief restarted there):
  one INFO line, then a wait until the heartbeat is `STALE_SECS` old; a
  heartbeat that moves meanwhile is a live run: refused as above;
- left by a dead run (this host, PID gone; or another host whose heartbeat
  is older than `STALE_SECS`): taken over with a WARNING naming the old
  owner. Only a holder proven gone is taken over.

On a cluster only the chief holds the lock (workers write no checkpoints;
the evaluator only reads).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from typing import Iterator, Optional

from absl import logging

__all__ = ["LOCK_NAME", "ModelDirLockedError", "acquire", "describe", "hold",
           "is_live", "pid_alive", "release", "release_held"]

LOCK_NAME = "train.lock"
HEARTBEAT_SECS = 30.0
STALE_SECS = 120.0  # another host's lock without a heartbeat this long: dead.
_HELD: set = set()  # the paths `hold` holds in this process.


class ModelDirLockedError(OSError):
  """Another live run writes the model dir."""


def _owner(job: Optional[str]) -> dict:
  return {"host": socket.gethostname(), "pid": os.getpid(), "job": job,
          "started": time.strftime("%Y-%m-%d %H:%M:%S")}


def _read(path: str) -> Optional[dict]:
  """The lock's owner; {} when garbled; None when there is no lock."""
  try:
    with open(path) as f:
      owner = json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError):
    return {}
  return owner if isinstance(owner, dict) else {}


def pid_alive(pid: int) -> bool:
  """Whether process `pid` exists on this host."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # another user's live process.
  return True


def is_live(owner: dict, path: str, job: Optional[str] = None) -> bool:
  """Whether `owner` (read from `path`) still writes the model dir: its
  PID runs on this host, or (another host) its heartbeat is fresh. `job`
  plays no part: the same job's addresses do not prove its chief gone."""
  del job
  if not owner:
    return False
  if _on_this_host(owner):
    return owner.get("pid") != os.getpid() and pid_alive(int(owner["pid"]))
  return _heartbeat_age(path) < STALE_SECS


def _on_this_host(owner: dict) -> bool:
  return owner.get("host") == socket.gethostname()


def _heartbeat_age(path: str) -> float:
  """Seconds since the lock was last refreshed (infinite: it is gone)."""
  return time.time() - _mtime(path)


def _mtime(path: str) -> float:
  try:
    return os.path.getmtime(path)
  except OSError:
    return float("-inf")


def describe(owner: dict) -> str:
  """`PID 123 on host a (since ...)`, or what is known of a garbled lock."""
  if not owner:
    return "an unreadable lock"
  job = f", job {owner['job']}" if owner.get("job") else ""
  return (f"PID {owner.get('pid')} on host {owner.get('host')} (since "
          f"{owner.get('started')}{job})")


def acquire(model_dir: str, job: Optional[str] = None) -> str:
  """Creates the lock (taking over a dead run's); returns its path.

  Raises:
    ModelDirLockedError: a live run holds it.
  """
  os.makedirs(model_dir, exist_ok=True)
  path = os.path.join(model_dir, LOCK_NAME)
  for _ in range(3):
    if _create(path, _owner(job)):
      return path
    owner = _read(path)
    if owner is not None:
      _check_or_take_over(owner, path, model_dir, job)
  raise ModelDirLockedError(f"--model_dir={model_dir}: another run keeps "
                            f"creating {path}; stop it and try again.")


def _create(path: str, owner: dict) -> bool:
  try:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
  except FileExistsError:
    return False
  with os.fdopen(fd, "w") as f:
    json.dump(owner, f)
  return True


def _check_or_take_over(owner: dict, path: str, model_dir: str,
                        job: Optional[str]) -> None:
  del job  # the holder's job proves nothing about whether it is alive.
  if owner and not _on_this_host(owner) and is_live(owner, path):
    _wait_until_stale(owner, path, model_dir)
  elif is_live(owner, path):
    raise _locked(owner, path, model_dir)
  logging.warning("Taking over --model_dir=%s from %s, which no longer runs "
                  "(its lock %s was left behind).", model_dir,
                  describe(owner), path)
  with contextlib.suppress(FileNotFoundError):
    os.remove(path)


def _locked(owner: dict, path: str, model_dir: str) -> ModelDirLockedError:
  return ModelDirLockedError(
      f"--model_dir={model_dir} is being written by another training, "
      f"{describe(owner)}; two runs would overwrite each other's "
      "checkpoints (a job launched twice?). Wait for it or stop it, or give "
      f"another --model_dir (if that process is not training, delete {path}).")


def _wait_until_stale(owner: dict, path: str, model_dir: str) -> None:
  """Another host's lock: waits until its heartbeat is `STALE_SECS` old
  (its run is gone); one that moves meanwhile is a live run.

  Raises:
    ModelDirLockedError: the heartbeat moved.
  """
  seen = _mtime(path)
  logging.info("--model_dir=%s is held by %s, another host, whose heartbeat "
               "is %.0f s old; waiting until it is %.0f s old (that run is "
               "gone) before taking it over.", model_dir, describe(owner),
               time.time() - seen, STALE_SECS)
  while _heartbeat_age(path) < STALE_SECS:
    time.sleep(min(1.0, STALE_SECS / 10))
    if _mtime(path) > seen:
      raise _locked(owner, path, model_dir)


def release(path: str) -> None:
  """Removes the lock if this process still holds it."""
  owner = _read(path)
  if owner and owner.get("pid") == os.getpid() and _on_this_host(owner):
    try:
      os.remove(path)
    except FileNotFoundError:
      pass
    except OSError as error:  # never hides why the run ended.
      logging.warning("Could not remove the model dir's lock %s (%s); "
                      "the next run takes it over (this PID is gone).",
                      path, error.strerror or error)


def _heartbeat(path: str, stop: threading.Event, secs: float) -> None:
  while not stop.wait(secs):
    with contextlib.suppress(OSError):
      os.utime(path)


@contextlib.contextmanager
def hold(model_dir: str, job: Optional[str] = None,
         heartbeat_secs: float = HEARTBEAT_SECS) -> Iterator[str]:
  """Holds the model dir's lock while the block runs (see the module doc).

  Args:
    model_dir: the run's model dir (created if needed).
    job: the cluster job this run belongs to (None: a local run).
    heartbeat_secs: how often the lock's time is refreshed.

  Yields:
    The lock file's path.

  Raises:
    ModelDirLockedError: a live run holds the lock.
  """
  path = acquire(model_dir, job)
  _HELD.add(path)
  stop = threading.Event()
  threading.Thread(target=_heartbeat, args=(path, stop, heartbeat_secs),
                   daemon=True, name="model_dir_lock").start()
  try:
    yield path
  finally:
    stop.set()
    _HELD.discard(path)
    release(path)


def release_held() -> None:
  """Releases every lock `hold` holds in this process: for an exit that
  skips the `hold` block's end (`os._exit`, `runtime.process_exit`)."""
  for path in sorted(_HELD):
    _HELD.discard(path)
    release(path)
