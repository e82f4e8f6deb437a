"""Issue 44 row 4: runs speak early. The progress hook's first line follows
the first step (its duration, an ETA), the next ones every N steps or 30 s,
whichever comes first. Driven by a clock of the test's own, so nothing here
depends on how fast the machine is."""

import logging
import types

import pytest
import tensorflow as tf

from estimator_multigpu.runtime import hooks

tf1 = tf.compat.v1


class Clock:
  """A clock the test moves by hand."""

  def __init__(self):
    self.now = 100.0

  def __call__(self) -> float:
    return self.now


def lines_of(caplog) -> list:
  return [r.getMessage() for r in caplog.records if r.name == "absl"]


def drive(hook: hooks.ProgressHook, clock: Clock, seconds_per_step) -> None:
  """Runs steps 1, 2, ... taking `seconds_per_step[i]` each."""
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    hook.begin()
    for step, seconds in enumerate(seconds_per_step, start=1):
      hook.before_run(None)
      clock.now += seconds
      hook.after_run(None, types.SimpleNamespace(
          results=(step, 0.5, 0.01), run_metadata=None))


def test_the_first_line_follows_the_first_step(caplog):
  clock = Clock()
  hook = hooks.ProgressHook(None, 8, 2, max_steps=101, every_n_steps=100,
                            clock=clock)
  with caplog.at_level(logging.INFO, logger="absl"):
    drive(hook, clock, [4.0])
  # 100 steps left at 4 s each: at most 400 s = 0:06:40.
  assert lines_of(caplog) == [
      "step 1  loss 0.5000  lr 0.01  first step 4.0 s (start-up included)  "
      "ETA at most 0:06:40; next line within 100 steps or 30 s"]


@pytest.mark.parametrize("every_n,seconds,ended", [
    (100, [5.0] + [2.0] * 30, [16, 31]),   # 30 s each: after 15 steps.
    (4, [5.0] + [2.0] * 12, [5, 9, 13]),   # 4 steps (8 s) come first.
    (100, [5.0, 45.0, 1.0], [2]),          # one slow step ends a window.
])
def test_a_line_every_n_steps_or_30_seconds(every_n, seconds, ended, caplog):
  clock = Clock()
  windows = []
  hook = hooks.ProgressHook(None, 8, 2, max_steps=1000,
                            every_n_steps=every_n, clock=clock)
  hook.add_listener(lambda throughput, _: windows.append(throughput))
  with caplog.at_level(logging.INFO, logger="absl"):
    drive(hook, clock, seconds)
  assert [w.step for w in windows] == ended
  lines = lines_of(caplog)
  assert len(lines) == 1 + len(ended)  # the first step's line, the windows'.
  assert all(line.startswith(f"step {step}  loss 0.5000  lr 0.01  ")
             for line, step in zip(lines[1:], ended))
  # 8 examples per 2 s step: 4 examples/sec, whatever the window's length.
  if every_n == 4:
    assert all(w.examples_per_sec == pytest.approx(4.0) for w in windows)


def test_without_max_steps_the_eta_is_unknown(caplog):
  clock = Clock()
  hook = hooks.ProgressHook(None, 8, 2, max_steps=None, every_n_steps=10,
                            every_secs=None, clock=clock)
  with caplog.at_level(logging.INFO, logger="absl"):
    drive(hook, clock, [1.0, 100.0])
  assert lines_of(caplog) == [
      "step 1  loss 0.5000  lr 0.01  first step 1.0 s (start-up included)  "
      "ETA ?; next line within 10 steps"]
