"""train.py's checks before it builds the training graph.

- `writer_lock`: one writer per model dir (estimator_multigpu.runtime.
  model_dir_lock); a local run and a cluster's chief hold it, the other
  tasks write no checkpoints and do not.
- `trained_step`: the step the model dir's checkpoint is at, so that a
  `--max_steps` at or below it says so instead of "training" to it.
- `check_batch_fits`: a global batch larger than an epoch of the training
  split is a mistake (1,000,000 on the 1,437 digits filled 24 GB).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from typing import ContextManager, Optional

from absl import logging
import tensorflow as tf

from estimator_multigpu import cluster
from estimator_multigpu.runtime import model_dir_lock

import datasets
from cli.model_dir import checkpoints
from datasets import tfrecord


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
    checkpoints.check_model_dir(model_dir, min_free_disk_mb)
  if task is not None and not task.is_chief:
    return contextlib.nullcontext()
  return model_dir_lock.hold(model_dir, job_id(task))


def trained_step(model_dir: str) -> Optional[int]:
  """The global step of the model dir's latest checkpoint (None: none)."""
  checkpoint = tf.train.latest_checkpoint(model_dir)
  if checkpoint is None:
    return None
  return int(tf.train.load_variable(checkpoint, "global_step"))


def nothing_to_train(model_dir: str, max_steps: int) -> bool:
  """Logs and returns True when the model dir is at or past `max_steps`."""
  step = trained_step(model_dir)
  if step is None or step < max_steps:
    return False
  logging.warning(
      "--model_dir=%s is already at step %d, at or past --max_steps=%d: "
      "nothing to train. Give --max_steps above %d to train on, or another "
      "--model_dir to start over.", model_dir, step, max_steps, step)
  return True


def check_batch_fits(batch_size: int, epoch_size: int, split: str,
                     dataset_name: str) -> None:
  """Raises when one global batch is larger than the training split.

  Raises:
    ValueError: naming both sizes and the fix.
  """
  if batch_size <= epoch_size:
    return
  raise ValueError(
      f"--batch_size={batch_size} is larger than the {epoch_size} examples "
      f"of split {split!r} of {dataset_name}: every batch would repeat the "
      f"split {batch_size / epoch_size:.1f} times over (and need that much "
      f"more memory); give --batch_size={epoch_size} or less.")


def split_size(dataset_name: str, split: str, dataset_dir: Optional[str],
               at_most: int) -> Optional[int]:
  """min(examples in the split, `at_most`); None when it has no epochs
  (synthetic) or cannot be read here (the input pipeline names why)."""
  if dataset_name == "synthetic":
    return None
  try:
    if dataset_name == "tfrecord":
      return tfrecord.count_records(dataset_dir, split, at_most)
    return datasets.num_examples(dataset_name, split, dataset_dir)
  except (ValueError, OSError):
    return None


def check_batch_of(batch_size: int, dataset_name: str, split: str,
                   dataset_dir: Optional[str]) -> None:
  """`check_batch_fits` on the split's size (read up to one batch and one).

  Raises:
    ValueError: the batch is larger than the split.
  """
  size = split_size(dataset_name, split, dataset_dir, batch_size + 1)
  if size:  # 0: an empty shard, which the input pipeline names.
    check_batch_fits(batch_size, size, split, dataset_name)
