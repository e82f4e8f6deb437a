"""Training hooks: progress, throughput summaries, non-finite losses, signals.

- `ProgressHook` measures the throughput once per window of N global steps
  (`Throughput`) and logs the step, loss, learning rate, examples per second
  (global and per tower) and the time left, and writes `examples_per_sec`
  and `examples_per_sec_per_tower` summaries. It is the one source of every
  examples/sec figure: listeners, such as the scaling report
  (`scaling.ScalingReportHook`), receive its `Throughput` for the window.
- `NonFiniteLossHook` stops training with an error naming the step and the
  towers whose loss is NaN or Inf; `FiniteCheckpointListener` refuses to
  save NaN or Inf variables (they can diverge a step before the loss).
- `SignalStop` turns SIGTERM / SIGINT into a clean stop, so Estimator writes
  a final checkpoint, and ends the process when a step blocks for good.
- `with_training_hooks` attaches hooks built from the merged EstimatorSpec to
  a (wrapped) model_fn, so they see the loss over the whole global batch.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import signal
import threading
import time
from typing import Callable, Optional

from absl import logging
import tensorflow as tf

from estimator_multigpu import specs

tf1 = tf.compat.v1


@dataclasses.dataclass(frozen=True)
class Throughput:
  """The examples per second of one window of global steps.

  A global step is one update: on a cluster of asynchronous workers, one
  worker's batch; `global_batch_size` is the examples it stands for.
  """
  step: int                # global step read at the window's end.
  steps: int               # global steps in the window.
  seconds: float           # wall-clock seconds of the window.
  global_batch_size: int   # examples per global step.
  num_towers: int

  @property
  def steps_per_sec(self) -> float:
    return self.steps / self.seconds

  @property
  def examples_per_sec(self) -> float:
    return self.steps_per_sec * self.global_batch_size

  @property
  def examples_per_sec_per_tower(self) -> float:
    return self.examples_per_sec / self.num_towers

  @property
  def ms_per_step(self) -> float:
    return 1000.0 * self.seconds / self.steps


# Called as listener(throughput, run_metadata) at the end of each window.
ThroughputListener = Callable[[Throughput, tf1.RunMetadata], None]


class ProgressHook(tf1.train.SessionRunHook):
  """Logs step, loss, learning rate, examples/sec and ETA every N steps.

  The first run starts the clock; a window ends at the first run whose
  global step is at least `every_n_steps` past the window's start.
  """

  def __init__(self, loss: tf.Tensor, global_batch_size: int,
               num_towers: int, max_steps: Optional[int], every_n_steps: int,
               output_dir: Optional[str] = None,
               learning_rate_name: str = "current_learning_rate"):
    """Creates the hook.

    Args:
      loss: the loss tensor to log (the merged spec's).
      global_batch_size: examples per global step over all towers.
      num_towers: how many towers share the global batch.
      max_steps: the last global step, for the ETA; None: no ETA.
      every_n_steps: global steps per window (>= 1).
      output_dir: where to write the throughput summaries; None: only log.
      learning_rate_name: the op whose value is logged as the learning rate.

    Raises:
      ValueError: a count is below 1.
    """
    for name, value in (("global_batch_size", global_batch_size),
                        ("num_towers", num_towers),
                        ("every_n_steps", every_n_steps)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an int >= 1; got {value!r}.")
    self._loss = loss
    self._global_batch_size = global_batch_size
    self._num_towers = num_towers
    self._max_steps = max_steps
    self._every_n_steps = every_n_steps
    self._output_dir = output_dir
    self._learning_rate_name = learning_rate_name
    self._listeners: list = []
    self._start: Optional[tuple] = None  # (step, time) of the window's start.
    self._step: Optional[int] = None  # the global step read last.
    self._increment = 1  # how far the global step moved in the last run.

  @property
  def global_batch_size(self) -> int:
    return self._global_batch_size

  @property
  def num_towers(self) -> int:
    return self._num_towers

  def add_listener(self, listener: ThroughputListener) -> None:
    """Calls `listener(throughput, run_metadata)` at the end of each window.

    After this hook's own line; `run_metadata` is the one of the run that
    ended the window (with a trace when a hook asked for one).
    """
    self._listeners.append(listener)

  def next_run_may_end_window(self) -> bool:
    """Whether the next run is expected to end the current window.

    Expects the global step to move as far as in the last run: one step per
    run locally, more on a cluster whose workers update asynchronously.
    False before the first run, which only starts the clock.
    """
    if self._start is None:
      return False
    return self._step + self._increment - self._start[0] >= (
        self._every_n_steps)

  def begin(self):
    graph = tf1.get_default_graph()
    self._global_step = tf1.train.get_global_step()
    names = {op.name for op in graph.get_operations()}
    name = self._learning_rate_name
    self._learning_rate = (graph.get_tensor_by_name(f"{name}:0")
                           if name in names else tf.constant(float("nan")))
    self._writer = (tf1.summary.FileWriterCache.get(self._output_dir)
                    if self._output_dir else None)
    self._start, self._step, self._increment = None, None, 1

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs(
        [self._global_step, self._loss, self._learning_rate])

  def after_run(self, run_context, run_values):
    step, loss, rate = run_values.results
    now = time.monotonic()
    if self._step is not None:
      self._increment = max(step - self._step, 1)
    self._step = step
    if self._start is None:
      self._start = (step, now)
      return
    start_step, start_time = self._start
    if step - start_step < self._every_n_steps:
      return
    self._start = (step, now)
    throughput = Throughput(step, step - start_step, now - start_time,
                            self._global_batch_size, self._num_towers)
    self._report(throughput, loss, rate)
    for listener in self._listeners:
      listener(throughput, run_values.run_metadata)

  def _report(self, throughput: Throughput, loss: float, rate: float) -> None:
    examples = throughput.examples_per_sec
    per_tower = throughput.examples_per_sec_per_tower
    eta = (datetime.timedelta(seconds=round(
        (self._max_steps - throughput.step) / throughput.steps_per_sec))
           if self._max_steps else "?")
    logging.info("step %d  loss %.4f  lr %.5g  %.1f examples/sec (%.1f per "
                 "tower x %d)  ETA %s", throughput.step, loss, rate, examples,
                 per_tower, self._num_towers, eta)
    if self._writer:
      self._writer.add_summary(tf1.Summary(value=[
          tf1.Summary.Value(tag="examples_per_sec", simple_value=examples),
          tf1.Summary.Value(tag="examples_per_sec_per_tower",
                            simple_value=per_tower)]), throughput.step)


HookFactory = Callable[[tf.estimator.EstimatorSpec], list]


def with_training_hooks(model_fn: Callable, make_hooks: HookFactory):
  """Wraps `model_fn` so TRAIN specs also carry `make_hooks(spec)`."""

  def model_fn_with_hooks(features, labels, mode, params, config):
    spec = model_fn(features, labels, mode, params, config)
    if mode != tf.estimator.ModeKeys.TRAIN:
      return spec
    return spec._replace(training_hooks=tuple(spec.training_hooks) +
                         tuple(make_hooks(spec)))

  return model_fn_with_hooks


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
  `specs.TOWER_LOSSES_COLLECTION`). It runs after Estimator's chief-only
  checkpoint saver, and the weights can turn NaN a step before the loss:
  install `FiniteCheckpointListener` too, so no NaN is ever saved. With
  `model_dir`, the error names the newest checkpoint there.
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

  def after_create_session(self, session, coord):
    self._step = int(session.run(self._global_step))

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs((self._loss[-1], self._tower_losses))

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
    logging.warning("Received %s: stopping after this step and saving a "
                    "checkpoint.", signal.Signals(number).name)
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
  logging.flush()
  os._exit(128 + signal_number)  # pylint: disable=protected-access
