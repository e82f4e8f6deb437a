"""Checkpoints and model dirs of the scripts: the checkpoint a path names,
whether it holds moving averages, the check that a run can save in a model
dir, and train.py's lock on it (`writer_lock`: one writer per model dir,
estimator_multigpu.runtime.model_dir_lock; a local run and a cluster's
chief hold it, the other tasks write no checkpoints and do not).

`check_model_dir` fails before any step when the model dir cannot be
written or its disk is nearly full; `checkpoint_schedule` refuses a schedule
that would never save (Estimator would then write no checkpoint at all, not
even at the end or on SIGTERM).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from typing import ContextManager, Optional

import tensorflow as tf

from estimator_multigpu import cluster
from estimator_multigpu.runtime import checkpoints as checkpoints_lib
from estimator_multigpu.runtime import model_dir_lock

from cli.model_dir import run_config

# The files of a checkpoint, after its prefix.
_CHECKPOINT_FILE = re.compile(r"\.(index|meta|data-\d+-of-\d+)$")


def trained_step(model_dir: str) -> Optional[int]:
  """The global step of the model dir's latest checkpoint (None: none)."""
  checkpoint = tf.train.latest_checkpoint(model_dir)
  if checkpoint is None:
    return None
  return int(tf.train.load_variable(checkpoint, "global_step"))


def resolve_checkpoint(path: str, flag: str = "--checkpoint_path") -> str:
  """The checkpoint `path` names: itself, or a directory's latest (the
  newest that reads back when it has no `checkpoint` state file).

  Args:
    path: a checkpoint prefix (`.../model.ckpt-1500`) or a directory.
    flag: the flag that gave `path`, for the message.

  Returns:
    The checkpoint prefix.

  Raises:
    FileNotFoundError: `path` is neither a checkpoint nor a directory that
      holds one.
  """
  if tf.io.gfile.isdir(path):
    latest = tf.train.latest_checkpoint(path) or _newest_on_disk(path)
    if latest is None:
      raise FileNotFoundError(
          f"{flag}={path} is a directory without a checkpoint that reads "
          "back; give a directory where train.py saved checkpoints, or a "
          f"checkpoint such as {os.path.join(path, 'model.ckpt-1500')}.")
    return latest
  if not tf.io.gfile.exists(path + ".index"):
    raise FileNotFoundError(
        f"{flag}={path} is not a checkpoint: {path}.index does not exist. "
        f"Give a checkpoint prefix (the name before .index, e.g. "
        f"runs/digits/model.ckpt-1500) or a directory holding checkpoints"
        f"{_suffix_hint(path)}.")
  return path


def _newest_on_disk(directory: str) -> Optional[str]:
  """Without a state file: the newest checkpoint there that reads back."""
  found = checkpoints_lib.newest_readable(directory)
  return found.prefix if found else None


def _suffix_hint(path: str) -> str:
  """`; here: <prefix>` when `path` names one of a checkpoint's files."""
  prefix = _CHECKPOINT_FILE.sub("", path)
  return f"; here: {prefix}" if prefix != path else ""


def checkpoint_has_ema(checkpoint: str) -> bool:
  """Whether the checkpoint holds moving averages of the weights."""
  return any(name.endswith("/ExponentialMovingAverage")
             for name, _ in tf.train.list_variables(checkpoint))


def check_model_dir(model_dir: str, min_free_mb: int) -> None:
  """Fails before any step when checkpoints could not be written.

  Raises:
    ValueError: the model dir is a file.
    OSError: the directory cannot be created or written, or its disk has
      less than `min_free_mb` MB free.
  """
  run_config.check_folder(model_dir)
  try:
    os.makedirs(model_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=model_dir, prefix=".write_check"):
      pass
  except OSError as error:
    reason = error.strerror or str(error)
    raise OSError(
        f"--model_dir={model_dir} cannot be written ({reason}); checkpoints "
        "would be lost. Choose a writable directory.") from error
  free_mb = shutil.disk_usage(model_dir).free / 2**20
  if free_mb < min_free_mb:
    raise OSError(
        f"--model_dir={model_dir} has {free_mb:.0f} MB free, less than "
        f"--min_free_disk_mb={min_free_mb}; checkpoints would fail. Free "
        "some space or choose another directory.")


def checkpoint_schedule(steps: Optional[int], secs: Optional[int],
                        steps_given: bool) -> tuple:
  """(save_checkpoints_steps, save_checkpoints_secs) for RunConfig.

  Raises:
    ValueError: a value that would never save (Estimator then writes no
      checkpoint at all, not even at the end), or both flags given.
  """
  if secs is not None:
    if steps_given:
      raise ValueError(
          f"--save_checkpoints_steps={steps} and --save_checkpoints_secs="
          f"{secs} both set when to save; give only one.")
    if secs <= 0:
      raise ValueError(
          f"--save_checkpoints_secs={secs} would never write a checkpoint, "
          "not even at the end or on SIGTERM; give a number of seconds > 0.")
    return None, secs
  if steps is None or steps <= 0:
    raise ValueError(
        f"--save_checkpoints_steps={steps} would never write a checkpoint, "
        "not even at the end or on SIGTERM, so a stopped run loses "
        "everything; give a number of steps > 0. To save only at the start "
        "and the end (SIGTERM included), give one larger than --max_steps.")
  return steps, None


def job_id(task: Optional[cluster.Task]) -> Optional[str]:
  """A cluster job's name for the lock: a hash of its addresses."""
  if task is None:
    return None
  text = json.dumps(task.cluster, sort_keys=True).encode()
  return "cluster-" + hashlib.sha1(text).hexdigest()[:12]


def writer_lock(task: Optional[cluster.Task], model_dir: str,
                min_free_disk_mb: int) -> ContextManager:
  """The model dir's lock for a local run or a chief; else nothing. The
  tasks that write the model dir (those and the evaluator) check first
  that they can.

  Raises:
    OSError: the model dir cannot be written (named first), or another
      live run holds it (`ModelDirLockedError`).
  """
  if task is None or task.is_chief or task.type == cluster.EVALUATOR:
    check_model_dir(model_dir, min_free_disk_mb)
  if task is not None and not task.is_chief:
    return contextlib.nullcontext()
  return model_dir_lock.hold(model_dir, job_id(task))
