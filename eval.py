"""Evaluates train.py's checkpoints: python eval.py --model_dir=runs/digits.

The net, classes, image size, data and last step come from the model_dir's
run_config.json (written by train.py); a flag given here overrides the
record, except that --model_name and --num_classes must match it.
--once evaluates the newest checkpoint; otherwise every new checkpoint is
evaluated as it appears, until one at the recorded last step (or
--max_steps), or --timeout_secs without a new one. Checkpoints are found on
disk (with or without the `checkpoint` state file); a newest one that does
not read back is skipped with a WARNING naming it, and one that a live
training rotates away while it is evaluated is replaced by the newest one.
The model dir is only read: the events go to <model_dir>/eval, or to
--eval_events_dir, or (a read-only model dir) to a temporary folder, named
in the log. --checkpoint_path evaluates exactly that checkpoint (a
directory: its latest) once; its directory is the model_dir unless
--model_dir is given. --max_num_batches evaluates at most that many batches
(tf-slim's flag). The last line printed is `key=value` pairs, e.g.
`accuracy=0.9694 global_step=1500 loss=0.1025 top_5=0.9972`. Ctrl-C stops
it at once (status 130) with one line saying what it was doing: it only
reads the model dir, so nothing there is lost.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple, Optional, Sequence

# First: a missing package is one line; then the C++ log level, set before
# anything imports TensorFlow (script_logging.before_tensorflow).
from cli import entry_point

# isort: split

# pylint: disable=g-import-not-at-top,wrong-import-position
import sys

from absl import flags
from absl import logging
import tensorflow as tf
import tqdm

import estimator_multigpu as emg
from estimator_multigpu.runtime import evaluation

import classifier
from cli import cluster_task
from cli import run_setup
from cli import script_logging
from cli import settings as settings_lib
from cli import towers as towers_lib
from cli.flags import definitions as cli_flags
from cli.model_dir import checkpoints
from cli.model_dir import eval_dirs
from cli.model_dir import restore_check
import datasets
from datasets import split_record

FLAGS = flags.FLAGS
tf1 = tf.compat.v1
FLAG_GROUPS = (cli_flags.shared, cli_flags.weights, cli_flags.evaluation)
cli_flags.define(*FLAG_GROUPS)
Settings = settings_lib.EvalSettings


class ProgressBarHook(tf1.train.SessionRunHook):
  """A tqdm bar over the eval batches, on its own line of a terminal.

  Not drawn when stderr is not a terminal (a log file, a test): there the
  "Evaluated <checkpoint>" line that follows is the progress.
  """

  def __init__(self, total: Optional[int], show: Optional[bool] = None):
    self._total = total
    self._show = sys.stderr.isatty() if show is None else show
    self._bar = None

  def after_create_session(self, session, coord):
    self._bar = tqdm.tqdm(total=self._total, desc="eval", unit="batch",
                          leave=True, disable=not self._show,
                          file=sys.stderr)

  def after_run(self, run_context, run_values):
    self._bar.update(1)

  def end(self, session):
    self._bar.close()


checkpoint_has_ema = checkpoints.checkpoint_has_ema


def num_eval_batches(dataset_name: str, split: str, batch_size: int,
                     dataset_dir: Optional[str] = None) -> Optional[int]:
  """The batches of a digits split, or of records whose converter recorded
  their count (None: other data, counted as read)."""
  if dataset_name == "digits":
    examples = len(datasets.load_digits_split(split)[1])
  elif dataset_name == "tfrecord" and dataset_dir:
    examples = split_record.recorded_count(dataset_dir, split)
  else:
    examples = None
  return None if examples is None else math.ceil(examples / batch_size)


def build_estimator(towers: towers_lib.Towers,
                    config: classifier.ClassifierConfig, model_dir: str,
                    use_ema: bool, events_dir: Optional[str] = None
                    ) -> tf.estimator.Estimator:
  """The classifier on the towers; EMA weights loaded when `use_ema`; its
  evaluation events in `events_dir` (None: `<model_dir>/eval`)."""
  model_fn = emg.multi_gpu(classifier.model_fn, devices=towers.devices,
                           ema_decay=0.999 if use_ema else None)  # names only.
  estimator = tf.estimator.Estimator(
      model_fn, params={"classifier": config}, config=tf.estimator.RunConfig(
          model_dir=model_dir, session_config=towers.session_config))
  if events_dir is not None:
    # Estimator forbids subclasses to override `eval_dir`; `evaluate` calls
    # it for the one folder it writes to (a checkpoint path is always given).
    estimator.eval_dir = lambda name=None: events_dir
  return estimator


def evaluate(estimator: tf.estimator.Estimator, input_fn, checkpoint: str,
             total_batches: Optional[int], max_batches: Optional[int] = None,
             hooks: Sequence[tf1.train.SessionRunHook] = ()) -> dict:
  """The metrics of `checkpoint`, over at most `max_batches` (None: all).

  With `total_batches` known, exactly that many are run: an input read to
  its end stops a multi-device step with a C++ "Local rendezvous is
  aborting" WARNING (TF >= 2.16) that a clean evaluation should not print.
  """
  if max_batches is not None and total_batches is not None:
    total_batches = min(total_batches, max_batches)
  steps = total_batches if total_batches is not None else max_batches
  return estimator.evaluate(
      input_fn, steps=steps, checkpoint_path=checkpoint,
      hooks=[ProgressBarHook(steps), *hooks])


def checkpoint_and_model_dir(checkpoint_path: Optional[str], model_dir: str,
                             model_dir_given: bool) -> tuple:
  """(the checkpoint --checkpoint_path names or None, the model_dir).

  Without --model_dir, the model_dir is the checkpoint's directory (its
  run_config.json; eval summaries go there).

  Raises:
    FileNotFoundError: --checkpoint_path names no checkpoint.
    ValueError: --model_dir holds no run but lies in one (`<run>/eval`).
  """
  if not checkpoint_path:
    eval_dirs.check_run_dir(model_dir)
    return None, model_dir
  checkpoint = checkpoints.resolve_checkpoint(checkpoint_path)
  if not model_dir_given:
    model_dir = os.path.dirname(checkpoint) or "."
  return checkpoint, model_dir


def eval_input_fn(setup: run_setup.ModelSetup, split: str,
                  batch_size: int):
  """`split` of `setup`'s data, once, in order, resized as in training."""
  return datasets.make_input_fn(
      setup.dataset_name, split, batch_size, image_size=setup.image_size,
      data_dir=setup.dataset_dir, num_classes=setup.num_classes,
      labels_offset=setup.labels_offset, is_training=False)


class Evaluation(NamedTuple):
  """What eval.py evaluates: where, which model, on which input."""
  towers: towers_lib.Towers
  model_dir: str
  checkpoint: Optional[str]
  config: classifier.ClassifierConfig
  max_steps: int
  input_fn: object
  total_batches: Optional[int]
  events_dir: str


def plan(settings: Settings) -> Evaluation:
  """Resolves the settings: towers, checkpoint, model_dir, model, input."""
  ev, data = settings.evaluation, settings.data
  towers = towers_lib.from_settings(settings.towers)
  checkpoint, model_dir = checkpoint_and_model_dir(
      ev.checkpoint_path, ev.model_dir, "model_dir" in ev.given)
  setup = run_setup.model_setup(model_dir, settings.model, data)
  if setup.record is None:
    logging.warning("--model_dir=%s has no run_config.json (train.py writes "
                    "it); using the model and data flags.", model_dir)
  split = run_setup.split_name(data, run_setup.EVAL_SPLIT)
  return Evaluation(
      towers, model_dir, checkpoint, setup.classifier_config(),
      run_setup.recorded_max_steps(setup.record, ev.max_steps,
                                   "max_steps" in ev.given),
      eval_input_fn(setup, split, data.batch_size),
      num_eval_batches(setup.dataset_name, split, data.batch_size,
                       setup.dataset_dir),
      eval_dirs.events_dir(model_dir, ev.eval_events_dir))


def evaluate_checkpoint(settings: Settings, planned: Evaluation,
                        checkpoint: str) -> dict:
  """The metrics of one checkpoint, with its moving averages if it has
  them (and `use_ema_weights`)."""
  use_ema = (settings.evaluation.use_ema_weights and
             checkpoint_has_ema(checkpoint))
  logging.info("Evaluating %s (%s weights)", checkpoint,
               "moving-average" if use_ema else "raw")
  estimator = build_estimator(planned.towers, planned.config,
                              planned.model_dir, use_ema, planned.events_dir)
  return evaluate(estimator, planned.input_fn, checkpoint,
                  planned.total_batches, settings.evaluation.max_num_batches)


def check_fits(planned: Evaluation, checkpoint: str) -> None:
  """Raises when `checkpoint` does not fit the graph eval.py builds.

  Raises:
    ValueError: saying what it was written with and the fix.
  """
  restore_check.check_estimator(
      build_estimator(restore_check.one_tower(planned.towers),
                      planned.config, planned.model_dir, use_ema=False),
      restore_check.input_specs(planned.input_fn),
      planned.config.num_classes, tf.estimator.ModeKeys.EVAL, checkpoint)


class Progress:
  """What eval.py is doing, for the line a Ctrl-C ends it with."""

  def __init__(self):
    self.model_dir: Optional[str] = None  # known once planned.
    self.current: Optional[str] = None  # the checkpoint being evaluated.
    self.evaluated: list = []  # (checkpoint, global step) done.

  def interrupted_line(self) -> str:
    """eval.py's own words for a Ctrl-C (it only reads the model dir)."""
    if self.current:
      doing = f"while evaluating {self.current}: its metrics were not written"
    elif self.model_dir is None:
      doing = "before evaluating"
    elif self.evaluated:
      doing = f"while waiting for a checkpoint after {self.evaluated[-1]}"
    else:
      doing = (f"while waiting for a checkpoint in {self.model_dir} (none "
               "evaluated)")
    done = (f"; {len(self.evaluated)} checkpoint(s) evaluated, their metrics "
            "written" if self.evaluated else "")
    return (f"eval.py: interrupted (Ctrl-C) {doing}. eval.py only reads the "
            f"model dir: nothing in it changed{done}. Run eval.py again to "
            "evaluate.")


def run(settings: Settings, progress: Optional[Progress] = None) -> dict:
  """Evaluates the checkpoint given, else each new one (the first is
  checked to fit the graph); returns the last metrics. `progress` is kept
  up to date (for a Ctrl-C's line)."""
  progress = progress or Progress()
  planned, ev = plan(settings), settings.evaluation
  progress.model_dir = planned.model_dir
  checked = set()

  def evaluate_one(checkpoint: str) -> dict:
    progress.current = checkpoint
    if not checked:
      check_fits(planned, checkpoint)
      checked.add(checkpoint)
    metrics = evaluate_checkpoint(settings, planned, checkpoint)
    progress.current = None
    progress.evaluated.append(checkpoint)
    return metrics

  if planned.checkpoint:
    return evaluate_one(planned.checkpoint)
  return evaluation.evaluate_checkpoints(
      evaluate_one, planned.model_dir, planned.max_steps, ev.timeout_secs,
      once=ev.once, require_max_steps=False)


def main(argv):
  del argv
  script_logging.configure(FLAGS.verbosity)
  cluster_task.check_tf_config(os.environ.get("TF_CONFIG"))
  progress = Progress()
  try:
    metrics = run(cli_flags.read(Settings), progress)
  except KeyboardInterrupt:
    sys.stderr.write(progress.interrupted_line() + "\n")
    sys.exit(entry_point.INTERRUPTED)
  print(evaluation.format_metrics(metrics))


if __name__ == "__main__":
  entry_point.run(main, __doc__)
