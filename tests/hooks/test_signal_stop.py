"""SignalStop: a signal stops training, even while a step never returns."""

import os
import signal
import threading
import time

import pytest
import tensorflow as tf

from estimator_multigpu.runtime import guards

tf1 = tf.compat.v1


def blocked_run(seconds):
  """A session.run that blocks in C++ for `seconds` (an empty queue)."""
  with tf.Graph().as_default():
    dequeue = tf1.FIFOQueue(1, [tf.int32], shapes=[[]]).dequeue()
    with tf1.Session() as session:
      with pytest.raises(tf.errors.DeadlineExceededError):
        session.run(dequeue, options=tf1.RunOptions(
            timeout_in_ms=int(seconds * 1000)))


def test_a_step_that_blocks_is_reported_after_the_grace_time():
  blocked = []
  with guards.SignalStop(blocked_secs=0.5,
                        on_blocked=lambda *args: blocked.append(args)) as stop:
    # Sent while the run blocks: Python's handler must wait for it.
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    blocked_run(seconds=5)
    # The watchdog reported while the run was still blocked; the handler ran
    # only once the run returned.
    assert blocked == [(signal.SIGTERM, 0.5)]
    assert stop.received == signal.SIGTERM


def test_a_signal_between_steps_only_requests_a_stop():
  blocked = []
  before = signal.getsignal(signal.SIGINT)  # SIG_IGN under nohup/&.
  with guards.SignalStop(blocked_secs=0.5,
                        on_blocked=lambda *args: blocked.append(args)) as stop:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(1.5)  # Python code: the handler runs at once.
  assert stop.received == signal.SIGINT and not blocked
  assert signal.getsignal(signal.SIGINT) is before  # restored.
