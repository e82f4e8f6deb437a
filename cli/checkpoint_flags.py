"""`--checkpoint_path`, of the three scripts (train.py, eval.py, export.py).

`--checkpoint_path` is defined here once, for all three scripts (absl lets a
flag be defined only once per process, and the tests import every script).
"""

from __future__ import annotations

import os
import re

from absl import flags
import tensorflow as tf

flags.DEFINE_string(
    "checkpoint_path", None,
    "A checkpoint (e.g. runs/digits/model.ckpt-1500), or a directory whose "
    "latest checkpoint is used. train.py: fine-tune from it (tf-slim's "
    "meaning): initialize the net from it when --model_dir has no "
    "checkpoint yet (a resume ignores it). eval.py: evaluate exactly this "
    "checkpoint, once. export.py: export it (default: the latest in "
    "--model_dir).")

# The files of a checkpoint, after its prefix.
_CHECKPOINT_FILE = re.compile(r"\.(index|meta|data-\d+-of-\d+)$")


def resolve_checkpoint(path: str, flag: str = "--checkpoint_path") -> str:
  """The checkpoint `path` names: itself, or a directory's latest.

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
    latest = tf.train.latest_checkpoint(path)
    if latest is None:
      raise FileNotFoundError(
          f"{flag}={path} is a directory without a checkpoint (no "
          "`checkpoint` state file naming one); give a directory where "
          "train.py saved checkpoints, or a checkpoint such as "
          f"{os.path.join(path, 'model.ckpt-1500')}.")
    return latest
  if not tf.io.gfile.exists(path + ".index"):
    raise FileNotFoundError(
        f"{flag}={path} is not a checkpoint: {path}.index does not exist. "
        f"Give a checkpoint prefix (the name before .index, e.g. "
        f"runs/digits/model.ckpt-1500) or a directory holding checkpoints"
        f"{_suffix_hint(path)}.")
  return path


def _suffix_hint(path: str) -> str:
  """`; here: <prefix>` when `path` names one of a checkpoint's files."""
  prefix = _CHECKPOINT_FILE.sub("", path)
  return f"; here: {prefix}" if prefix != path else ""
