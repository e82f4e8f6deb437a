"""Guards against lost work: non-finite values and signals.

- `NonFiniteLossHook` stops training with an error naming the step and the
  towers whose loss is NaN or Inf; `FiniteCheckpointListener` refuses to
  save NaN or Inf variables (they can diverge a step before the loss), so
  the newest checkpoint is always a finite one.
- `SignalStop` turns SIGTERM / SIGINT into a clean stop, so Estimator writes
  a final checkpoint, and ends the process when a step blocks for good.
"""

from __future__ import annotations

import math
import os
import signal
import threading
from typing import Callable, Optional

from absl import logging
import tensorflow as tf

from estimator_multigpu.graph import nan_guard
from estimator_multigpu.graph import specs
from estimator_multigpu.runtime import process_exit

tf1 = tf.compat.v1

__all__ = ["FiniteCheckpointListener", "NonFiniteLossError",
           "NonFiniteLossHook", "SignalStop", "last_checkpoint_sentence"]


class NonFiniteLossError(RuntimeError):
  """The training loss, or a variable about to be saved, became NaN or Inf."""


def last_checkpoint_sentence(model_dir: Optional[str]) -> str:
  """Names the newest checkpoint of `model_dir` for a NaN error message.

  With `FiniteCheckpointListener` installed every checkpoint was checked for
  NaN/Inf before it was written, so the newest one is the last finite one.
  """
  state = tf.train.get_checkpoint_state(model_dir) if model_dir else None
  if state is None or not state.model_checkpoint_path:
    return ("No checkpoint was written before it (nothing to resume from: "
            "the next run starts over).")
  older = [os.path.basename(path) for path in
           state.all_model_checkpoint_paths[:-1]]
  sentence = (f"The newest checkpoint, {state.model_checkpoint_path}, holds "
              "only finite values (each save is checked first); a rerun "
              "resumes from it.")
  if older:
    sentence += (" If that rerun diverges at once, its weights were already "
                 "blowing up: move its files away to resume from an older "
                 f"one ({', '.join(older)}).")
  return sentence


_FIXES = ("Lower the learning rate, clip gradients (--clip_gradients_by_norm) "
          "or check the input for NaN/Inf, then run again with the same "
          "model dir.")


class NonFiniteLossHook(tf1.train.SessionRunHook):
  """Raises `NonFiniteLossError` naming the step and towers of a NaN loss.

  Pass it to `Estimator.train(hooks=[...])`: hooks given there run before
  Estimator's own `NanTensorHook`, whose message names neither. The hook
  reads the losses `multi_gpu` publishes (`specs.LOSS_COLLECTION`,
  `specs.TOWER_LOSSES_COLLECTION`) and turns off `multi_gpu`'s own check
  (`graph.nan_guard`, whose message has no step). It runs after Estimator's
  chief-only checkpoint saver, and the weights can turn NaN a step before
  the loss: install `FiniteCheckpointListener` too, so no NaN is ever saved.
  With `model_dir`, the error names the newest checkpoint there.
  """

  def __init__(self, model_dir: Optional[str] = None):
    self._model_dir = model_dir

  def begin(self):
    self._loss = tf1.get_collection(specs.LOSS_COLLECTION)
    self._tower_losses = tf1.get_collection(specs.TOWER_LOSSES_COLLECTION)
    if not self._loss:
      raise ValueError("NonFiniteLossHook found no loss: wrap the model_fn "
                       "with estimator_multigpu.multi_gpu.")
    self._global_step = tf1.train.get_global_step()
    self._step = None
    self._feed = {enabled: False for enabled in tf1.get_collection(
        nan_guard.ENABLED_COLLECTION)}

  def after_create_session(self, session, coord):
    self._step = int(session.run(self._global_step))

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs((self._loss[-1], self._tower_losses),
                                    feed_dict=self._feed)

  def after_run(self, run_context, run_values):
    self._step += 1
    loss, tower_losses = run_values.results
    if math.isfinite(loss):
      return
    bad = [str(i) for i, value in enumerate(tower_losses)
           if not math.isfinite(value)]
    where = f" (non-finite in tower(s) {', '.join(bad)})" if bad else ""
    raise NonFiniteLossError(
        f"The loss is {loss} at step {self._step}{where}; training stopped "
        f"without saving it. {last_checkpoint_sentence(self._model_dir)} "
        f"{_FIXES}")


class FiniteCheckpointListener(tf1.train.CheckpointSaverListener):
  """Refuses to write a checkpoint that holds NaN or Inf values.

  Pass it to `Estimator.train(saving_listeners=[...])`. Before every save
  (periodic, at the start, and the final one at the end, e.g. after
  SIGTERM) it checks every floating-point global variable (weights,
  optimizer slots, moving averages) and raises `NonFiniteLossError` naming
  the step, the variables and the newest (finite) checkpoint in `model_dir`
  instead of saving. The check is one small fetch, only when saving.
  """

  def __init__(self, model_dir: str):
    self._model_dir = model_dir

  def begin(self):
    variables = [v for v in tf1.global_variables()
                 if v.dtype.base_dtype.is_floating]
    self._names = [v.op.name for v in variables]
    with tf.name_scope("finite_check"):
      self._finite = (tf.stack([tf.reduce_all(tf.math.is_finite(v))
                                for v in variables])
                      if variables else tf.constant([], tf.bool))

  def before_save(self, session, global_step_value):
    finite = session.run(self._finite)
    if finite.all():
      return
    bad = [name for name, ok in zip(self._names, finite) if not ok]
    raise NonFiniteLossError(
        f"{len(bad)} variable(s) hold NaN or Inf at step {global_step_value} "
        f"(e.g. {', '.join(bad[:3])}); checkpoint {global_step_value} was "
        f"not written. {last_checkpoint_sentence(self._model_dir)} {_FIXES}")


class SignalStop:
  """Context manager: SIGTERM / SIGINT end training cleanly.

  Inside it, the first such signal makes `hook()` request a stop after the
  current step; Estimator then saves a final checkpoint. A second signal
  gets the default behaviour (immediate exit).

  Python runs signal handlers only when the main thread is back in Python,
  so a step that never returns (a synchronous step waiting for a dead
  worker) would ignore the signal. With `blocked_secs`, a watchdog thread
  learns of each signal from the interpreter's wakeup fd and, if the handler
  has still not run `blocked_secs` later, calls `on_blocked(signal_number,
  blocked_secs)` (default: log why and exit with status 128 + signal).
  """

  def __init__(self, signals=(signal.SIGTERM, signal.SIGINT),
               blocked_secs: Optional[float] = None,
               on_blocked: Optional[Callable[[int, float], None]] = None):
    self._signals = signals
    self._previous = {}
    self._blocked_secs = blocked_secs
    self._on_blocked = on_blocked or _exit_blocked
    self._handled = threading.Event()
    self._pipe = None
    self._previous_fd = -1
    self.received: Optional[int] = None

  def __enter__(self) -> "SignalStop":
    for number in self._signals:
      self._previous[number] = signal.signal(number, self._handle)
    if self._blocked_secs is not None:
      self._pipe = os.pipe()
      os.set_blocking(self._pipe[1], False)
      self._previous_fd = signal.set_wakeup_fd(self._pipe[1],
                                               warn_on_full_buffer=False)
      threading.Thread(target=self._watch, args=(self._pipe[0],),
                       daemon=True, name="signal_watchdog").start()
    return self

  def __exit__(self, *exc_info):
    for number, handler in self._previous.items():
      signal.signal(number, handler)
    if self._pipe is not None:
      signal.set_wakeup_fd(self._previous_fd)
      os.close(self._pipe[1])  # the watchdog reads end-of-file and returns.

  def _handle(self, number, frame):
    del frame
    self.received = number
    self._handled.set()
    logging.warning("Received %s: stopping after this step (the last line "
                    "says which checkpoint was saved).",
                    signal.Signals(number).name)
    signal.signal(number, self._previous[number])

  def _watch(self, read_fd: int) -> None:
    try:
      while True:
        data = os.read(read_fd, 1)
        if not data:
          return
        if data[0] in self._signals and not self._handled.wait(
            self._blocked_secs):
          self._on_blocked(data[0], self._blocked_secs)
          return
    finally:
      os.close(read_fd)

  def hook(self) -> tf1.train.SessionRunHook:
    """A hook that requests a stop once a signal was received."""
    stop = self

    class _StopHook(tf1.train.SessionRunHook):

      def after_run(self, run_context, run_values):
        if stop.received is not None:
          run_context.request_stop()

    return _StopHook()


def _exit_blocked(signal_number: int, waited_secs: float) -> None:
  logging.error("Signal %d arrived %.0f s ago, but the current step has not "
                "finished; exiting now without a final checkpoint (a restart "
                "resumes from the newest one).", signal_number, waited_secs)
  process_exit.exit_now(128 + signal_number)
