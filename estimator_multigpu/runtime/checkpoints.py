"""A model dir's checkpoints: find them, verify them, repair the state file.

Estimator resumes from the checkpoint the `checkpoint` state file names, and
starts over from step 0 when that file is missing or garbled, even with
`model.ckpt-*` files beside it (its saver then deletes or overwrites them).
A truncated or bit-flipped newest checkpoint stops it with a raw TensorFlow
error. `prepare_model_dir` runs before the Estimator (on the chief, or a
local run) and leaves a state file that names the newest usable checkpoint:

- Leftovers of interrupted saves are removed: `<prefix>_temp` folders (a
  save writes its shards there first), `checkpoint.tmp*` files (the state
  file is written to one, then renamed), and files of a checkpoint that has
  no `.index` or misses a `.data` shard and that the state file does not list
  (a save killed while merging its shards).
- A checkpoint is usable when its `.index` and every `.data` shard exist and
  every tensor reads back (TensorFlow checks each tensor's checksum) with no
  NaN or Inf. The newest usable one is chosen; newer unusable ones are moved
  to `<model_dir>/corrupt/` with a WARNING naming them and the one chosen.
- The state file is rewritten when it is missing, garbled or names another
  checkpoint; when nothing is usable, `UnusableCheckpointsError` says what
  to do instead of training from scratch.

Readers that must not change the model dir (an evaluation next to a live
training, or of a read-only dir) use `newest_readable`: the newest finished
checkpoint that reads back, found on disk with or without the state file,
newer unreadable ones skipped with a WARNING naming them.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
from typing import Optional

from absl import logging
import numpy as np
import tensorflow as tf

__all__ = ["CORRUPT_DIR", "STATE_FILE", "Checkpoint",
           "UnusableCheckpointsError", "find_checkpoints",
           "finished_checkpoints", "move_aside", "newest_readable",
           "prepare_model_dir", "remove_stale_files", "step_of",
           "unusable_reason"]

tf1 = tf.compat.v1

STATE_FILE = "checkpoint"
CORRUPT_DIR = "corrupt"
_FILE_RE = re.compile(
    r"^(?P<prefix>.+-(?P<step>\d+))\.(?:index|meta|"
    r"data-(?P<shard>\d+)-of-(?P<shards>\d+))$")


class UnusableCheckpointsError(RuntimeError):
  """The model dir has checkpoints, and none of them can be restored."""


@dataclasses.dataclass
class Checkpoint:
  """One checkpoint prefix (`<dir>/model.ckpt-<step>`) and its files."""
  prefix: str
  step: int
  files: list = dataclasses.field(default_factory=list)
  has_index: bool = False
  shards: set = dataclasses.field(default_factory=set)
  num_shards: Optional[int] = None

  @property
  def name(self) -> str:
    return os.path.basename(self.prefix)

  def missing_files(self) -> list:
    """The files a complete checkpoint has and this one lacks."""
    missing = [] if self.has_index else [f"{self.name}.index"]
    if self.num_shards is None:
      return missing + [f"{self.name}.data-*"]
    return missing + [f"{self.name}.data-{k:05d}-of-{self.num_shards:05d}"
                      for k in range(self.num_shards) if k not in self.shards]


def find_checkpoints(model_dir: str) -> list:
  """Every checkpoint prefix with at least one file in `model_dir`, by step."""
  found = {}
  for path in glob.glob(os.path.join(glob.escape(model_dir), "*-*.*")):
    match = _FILE_RE.match(os.path.basename(path))
    if not match or not os.path.isfile(path):
      continue
    prefix = os.path.join(model_dir, match["prefix"])
    checkpoint = found.setdefault(prefix,
                                  Checkpoint(prefix, int(match["step"])))
    checkpoint.files.append(path)
    if path.endswith(".index"):
      checkpoint.has_index = True
    elif match["shard"] is not None:
      checkpoint.shards.add(int(match["shard"]))
      checkpoint.num_shards = int(match["shards"])
  return sorted(found.values(), key=lambda c: (c.step, c.prefix))


def unusable_reason(checkpoint: Checkpoint) -> Optional[str]:
  """Why `checkpoint` cannot be restored, or None when it can.

  Reads every tensor: a truncated or altered file fails its checksum, and
  floating-point values must all be finite.
  """
  missing = checkpoint.missing_files()
  if missing:
    return f"missing {', '.join(missing)}"
  try:
    reader = tf.train.load_checkpoint(checkpoint.prefix)
    non_finite = []
    for name in sorted(reader.get_variable_to_dtype_map()):
      value = reader.get_tensor(name)
      if (isinstance(value, np.ndarray) and value.dtype.kind == "f" and
          not np.all(np.isfinite(value))):
        non_finite.append(name)
  except Exception as error:  # pylint: disable=broad-except
    # A damaged file fails in many ways: DataLossError, OutOfRangeError,
    # IndexError ("Read less bytes than requested"), ...
    message = getattr(error, "message", None) or str(error)
    return f"unreadable ({type(error).__name__}: {message.splitlines()[0]})"
  if non_finite:
    return (f"NaN/Inf in {len(non_finite)} variable(s), e.g. "
            f"{', '.join(non_finite[:3])}")
  return None


def _read_state(model_dir: str) -> tuple:
  """(state or None, why it is unusable or None)."""
  path = os.path.join(model_dir, STATE_FILE)
  if not os.path.exists(path):
    return None, f"{path} is missing"
  try:
    state = tf.train.get_checkpoint_state(model_dir)  # None when garbled.
  except ValueError:  # parsed, but names no checkpoint (e.g. empty).
    state = None
  if state is None or not state.model_checkpoint_path:
    return None, f"{path} is garbled or names no checkpoint"
  return state, None


def remove_stale_files(model_dir: str, listed: set) -> list:
  """Removes leftovers of interrupted saves; returns what was removed.

  Args:
    model_dir: the model dir.
    listed: basenames of the checkpoints the state file lists; their files
      are never removed here, even when incomplete.
  """
  removed = []
  for path in glob.glob(os.path.join(glob.escape(model_dir), "*_temp*")):
    if os.path.isdir(path) and re.search(r"-\d+_temp", path):
      shutil.rmtree(path, ignore_errors=True)
      removed.append(path)
  for path in glob.glob(os.path.join(glob.escape(model_dir),
                                     f"{STATE_FILE}.tmp*")):
    os.remove(path)
    removed.append(path)
  for checkpoint in find_checkpoints(model_dir):
    if checkpoint.name not in listed and checkpoint.missing_files():
      for path in checkpoint.files:
        os.remove(path)
        removed.append(path)
  for path in removed:
    logging.info("Removed %s, left by an interrupted checkpoint save.", path)
  return removed


def move_aside(model_dir: str, checkpoint: Checkpoint) -> str:
  """Moves a checkpoint's files to `<model_dir>/corrupt/`; returns that dir."""
  target = os.path.join(model_dir, CORRUPT_DIR)
  os.makedirs(target, exist_ok=True)
  for path in checkpoint.files:
    os.replace(path, os.path.join(target, os.path.basename(path)))
  return target


def prepare_model_dir(model_dir: str) -> Optional[str]:
  """Makes `model_dir`'s state file name its newest usable checkpoint.

  Returns:
    The prefix training will resume from, or None for a fresh start (no
    checkpoint files at all).

  Raises:
    UnusableCheckpointsError: there are checkpoint files, or a state file
      naming checkpoints, and no checkpoint can be restored.
  """
  if not os.path.isdir(model_dir):
    return None
  state, state_problem = _read_state(model_dir)
  listed = set()
  if state is not None:
    listed = {os.path.basename(p) for p in
              [state.model_checkpoint_path,
               *state.all_model_checkpoint_paths]}
  remove_stale_files(model_dir, listed)
  candidates = find_checkpoints(model_dir)
  if not candidates:
    if state is not None:
      raise UnusableCheckpointsError(
          f"{os.path.join(model_dir, STATE_FILE)} names "
          f"{os.path.basename(state.model_checkpoint_path)}, but no "
          f"checkpoint files are left in {model_dir}. Restore them, or "
          "delete the state file to start over from step 0.")
    return None
  chosen, rejected = None, []
  for checkpoint in reversed(candidates):
    reason = unusable_reason(checkpoint)
    if reason is None:
      chosen = checkpoint
      break
    rejected.append((checkpoint, reason))
  if chosen is None:
    raise UnusableCheckpointsError(
        f"None of the {len(candidates)} checkpoint(s) in {model_dir} can be "
        "restored: " + "; ".join(f"{c.name}: {why}" for c, why in rejected) +
        ". Restore a good copy, or move them away (and the state file) to "
        "start over from step 0.")
  for checkpoint, reason in rejected:
    where = move_aside(model_dir, checkpoint)
    logging.warning("Checkpoint %s cannot be restored: %s. Moved its files "
                    "to %s. Resuming from the newest usable one, %s, "
                    "instead.", checkpoint.prefix, reason, where,
                    chosen.prefix)
  _write_state(model_dir, state, state_problem, chosen)
  logging.debug("Resuming from checkpoint %s (step %d).", chosen.prefix,
                chosen.step)
  return chosen.prefix


def _write_state(model_dir: str, state, state_problem: Optional[str],
                 chosen: Checkpoint) -> None:
  """Rewrites the state file unless it already names `chosen`."""
  complete = [c.name for c in find_checkpoints(model_dir)
              if not c.missing_files() and c.step <= chosen.step]
  if state is not None and os.path.basename(
      state.model_checkpoint_path) == chosen.name:
    listed = [os.path.basename(p) for p in state.all_model_checkpoint_paths]
    if set(listed) <= set(complete):
      return
  kept = [name for name in complete if name != chosen.name] + [chosen.name]
  tf1.train.update_checkpoint_state(model_dir, chosen.name, kept)
  if state_problem is not None:
    logging.warning("%s, but the model dir holds checkpoints: rebuilt it "
                    "from the newest usable one, %s (%d checkpoint(s) "
                    "listed).", state_problem, chosen.name, len(kept))
  else:
    logging.warning("%s now names %s (it named %s).",
                    os.path.join(model_dir, STATE_FILE), chosen.name,
                    os.path.basename(state.model_checkpoint_path))



def step_of(prefix: str) -> int:
  """The global step of a checkpoint prefix (`.../model.ckpt-<step>`)."""
  return int(prefix.rsplit("-", 1)[1])


def finished_checkpoints(model_dir: str) -> list:
  """The complete checkpoints of `model_dir`, by step, without a save still
  being written: with a readable state file, those up to the newest it
  names (a save writes it last); without one, every complete one on disk."""
  complete = [c for c in find_checkpoints(model_dir) if not c.missing_files()]
  state, _ = _read_state(model_dir)
  if state is None or not re.search(r"-\d+$", state.model_checkpoint_path):
    return complete
  newest = step_of(state.model_checkpoint_path)
  return [c for c in complete if c.step <= newest]


def newest_readable(model_dir: str, after_step: int = -1,
                    skipped: Optional[set] = None) -> Optional[Checkpoint]:
  """The newest finished checkpoint past `after_step` that reads back whole
  (`unusable_reason`); the model dir is left as it is (a reader may share
  it with a live training, or not be allowed to write it).

  Args:
    model_dir: the model dir.
    after_step: only checkpoints of a later step count.
    skipped: prefixes already found unreadable; those found now are added,
      each named once in a WARNING with the checkpoint read instead.

  Returns:
    The checkpoint, or None when no such checkpoint reads back.
  """
  skipped = set() if skipped is None else skipped
  chosen, rejected = None, []
  for checkpoint in reversed(finished_checkpoints(model_dir)):
    if checkpoint.step <= after_step:
      break
    if checkpoint.prefix in skipped:
      continue
    reason = unusable_reason(checkpoint)
    if reason is None:
      chosen = checkpoint
      break
    rejected.append((checkpoint, reason))
  instead = (f"reading the newest one that reads back, {chosen.prefix}, "
             "instead" if chosen else "no older one is left to read")
  for checkpoint, reason in rejected:
    skipped.add(checkpoint.prefix)
    logging.warning("Skipping checkpoint %s: %s; %s.", checkpoint.prefix,
                    reason, instead)
  return chosen
