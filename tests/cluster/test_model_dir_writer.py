"""One writer per model dir: a lock is taken over only from a holder
proven gone (its PID on this host, or another host's stale heartbeat)."""

import json
import logging
import os
import socket
import subprocess
import threading
import time

import pytest

from estimator_multigpu.runtime import model_dir_lock


def write_lock(model_dir, host, pid, job=None):
  os.makedirs(model_dir, exist_ok=True)
  path = os.path.join(model_dir, model_dir_lock.LOCK_NAME)
  with open(path, "w") as f:
    json.dump({"host": host, "pid": pid, "job": job, "started": "earlier"},
              f)
  return path


@pytest.fixture
def live_pid():
  process = subprocess.Popen(["sleep", "60"])
  yield process.pid
  process.kill()
  process.wait()


@pytest.mark.parametrize("job", ["cluster-abc", None])
def test_a_live_holder_of_the_same_job_is_refused_by_name(tmp_path, live_pid,
                                                          job):
  """A job launched twice: same addresses (same job), live chief."""
  path = write_lock(str(tmp_path), socket.gethostname(), live_pid, job)
  with pytest.raises(model_dir_lock.ModelDirLockedError,
                     match=f"PID {live_pid} on host .*launched twice"):
    model_dir_lock.acquire(str(tmp_path), "cluster-abc")
  assert json.load(open(path))["pid"] == live_pid  # untouched.


def test_a_gone_holder_of_the_same_job_is_taken_over(tmp_path):
  process = subprocess.Popen(["true"])
  process.wait()
  write_lock(str(tmp_path), socket.gethostname(), process.pid, "cluster-abc")
  path = model_dir_lock.acquire(str(tmp_path), "cluster-abc")
  assert json.load(open(path))["pid"] == os.getpid()


def test_another_hosts_lock_is_waited_for_until_stale(tmp_path, monkeypatch,
                                                      caplog):
  """A chief restarted on another host: one line, then the takeover."""
  monkeypatch.setattr(model_dir_lock, "STALE_SECS", 1.5)
  # absl's logger: a test before may have set its level (set_verbosity).
  caplog.set_level(logging.INFO, logger="absl")
  write_lock(str(tmp_path), "elsewhere", 1, "cluster-abc")
  path = model_dir_lock.acquire(str(tmp_path), "cluster-abc")
  assert json.load(open(path))["pid"] == os.getpid()
  assert "another host, whose heartbeat is" in caplog.text


def test_another_hosts_live_heartbeat_is_refused(tmp_path, monkeypatch):
  monkeypatch.setattr(model_dir_lock, "STALE_SECS", 30.0)
  path = write_lock(str(tmp_path), "elsewhere", 1)
  stop = threading.Event()

  def beat():  # the live holder's heartbeat, every 0.3 s.
    while not stop.wait(0.3):
      os.utime(path)

  thread = threading.Thread(target=beat)
  thread.start()
  try:
    time.sleep(0.05)  # a heartbeat strictly after the first read.
    with pytest.raises(model_dir_lock.ModelDirLockedError,
                       match="PID 1 on host elsewhere"):
      model_dir_lock.acquire(str(tmp_path))
  finally:
    stop.set()
    thread.join()
  assert json.load(open(path))["host"] == "elsewhere"


def test_a_lock_that_cannot_be_removed_hides_nothing(tmp_path, monkeypatch,
                                                     caplog):
  """A model dir turned read-only: the release says so and raises nothing
  (the error that ended the run stays the one reported)."""
  path = model_dir_lock.acquire(str(tmp_path))

  def read_only(name):
    raise PermissionError(13, "Permission denied", name)

  monkeypatch.setattr(os, "remove", read_only)
  model_dir_lock.release(path)
  assert "Could not remove the model dir's lock" in caplog.text


def _exits(monkeypatch):
  """os._exit recorded instead of run (every exit path ends in it)."""
  statuses = []
  monkeypatch.setattr(os, "_exit", statuses.append)
  return statuses


@pytest.mark.parametrize("end", ["exit_process", "peer_gone", "blocked"])
def test_every_way_a_task_ends_at_once_releases_the_lock(tmp_path,
                                                          monkeypatch, end):
  """os._exit skips the `hold` block's release: each immediate exit
  releases the locks this process holds first (a lock of another
  process stays)."""
  from estimator_multigpu import cluster  # pylint: disable=g-import-not-at-top
  from estimator_multigpu.cluster.all_reduce import peer_probe  # pylint: disable=g-import-not-at-top
  from estimator_multigpu.runtime import guards  # pylint: disable=g-import-not-at-top
  statuses = _exits(monkeypatch)
  other = write_lock(str(tmp_path / "other"), socket.gethostname(), 1)
  with model_dir_lock.hold(str(tmp_path / "mine")) as path:
    {"exit_process": lambda: cluster.exit_process(3),
     "peer_gone": lambda: peer_probe._exit("task worker:0 is gone"),
     "blocked": lambda: guards._exit_blocked(15, 2.0)}[end]()
    assert not os.path.exists(path)
  assert statuses == [{"exit_process": 3, "peer_gone": 1,
                       "blocked": 128 + 15}[end]]
  assert os.path.exists(other)
