"""A split is whole: every ``-of-N`` shard present, and as the converter
wrote it.

``python convert.py`` writes, beside the shards and ``labels.txt``, a small
record ``splits.json`` of each split it wrote: per shard its file name, its
number of records and its size in bytes::

  {"train": [{"file": "train-00000-of-00002.tfrecord", "records": 11,
              "bytes": 2840}, ...]}

`check_whole` runs before a pipeline reads a split (train.py and eval.py
alike): the shards' names must count 0 .. N-1 of one N, and where the
record lists the split, every listed shard must be there with its size (a
`stat`, no read), so a missing or cut shard is one line naming it instead
of a run on part of the data.
"""

import json
import os
import re
from typing import Dict, List, Optional, Sequence

import tensorflow as tf

FILENAME = 'splits.json'
_SHARD_RE = re.compile(r'-(\d+)-of-(\d+)(\.[^-]*)?$')
Shard = Dict[str, object]


def read(data_dir: str) -> Dict[str, List[Shard]]:
  """The record of `data_dir` ({} without one, or an unreadable one)."""
  path = os.path.join(data_dir, FILENAME)
  if not tf.io.gfile.exists(path):
    return {}
  try:
    with tf.io.gfile.GFile(path) as f:
      record = json.load(f)
  except ValueError:
    return {}
  return record if isinstance(record, dict) else {}


def write(path: str, record: Dict[str, List[Shard]]) -> None:
  """Writes `record` as JSON to `path`."""
  with tf.io.gfile.GFile(path, 'w') as f:
    json.dump(record, f, indent=1, sort_keys=True)


def recorded_count(data_dir: str, split: str) -> Optional[int]:
  """The records the converter wrote to a split (None: not recorded)."""
  shards = read(data_dir).get(split)
  if not isinstance(shards, list) or not all(
      isinstance(shard.get('records'), int) for shard in shards):
    return None
  return sum(shard['records'] for shard in shards)


def describe(files: Sequence[str]) -> List[Shard]:
  """The record entries of freshly written shard files (records unknown:
  the converter adds them)."""
  return [{'file': os.path.basename(path),
           'bytes': tf.io.gfile.stat(path).length} for path in files]


def _numbering(files: Sequence[str]) -> Dict[int, List[int]]:
  """N -> the indices i of the files named ``*-i-of-N``."""
  found: Dict[int, List[int]] = {}
  for path in files:
    match = _SHARD_RE.search(os.path.basename(path))
    if match:
      found.setdefault(int(match.group(2)), []).append(int(match.group(1)))
  return found


def _check_numbering(files: Sequence[str], split: str, data_dir: str) -> None:
  """Raises unless the shards count 0 .. N-1 of one N."""
  found = _numbering(files)
  if len(found) > 1:
    counts = ', '.join(f'-of-{n:05d} ({len(found[n])} files)'
                       for n in sorted(found))
    raise ValueError(
        f'Split {split!r} in {data_dir} mixes the shards of '
        f'{len(found)} conversions: {counts}. Keep one set (or convert '
        'again with python convert.py --overwrite).')
  for total, indices in found.items():
    missing = sorted(set(range(total)) - set(indices))
    if missing:
      _raise_missing(split, data_dir, total, missing, files[0])


def _raise_missing(split: str, data_dir: str, total: int,
                   missing: List[int], example: str) -> None:
  name = _SHARD_RE.sub('-{:05d}-of-{:05d}\\3', os.path.basename(example))
  shown = ', '.join(name.format(i, total) for i in missing[:3])
  more = f' and {len(missing) - 3} more' if len(missing) > 3 else ''
  raise ValueError(
      f'Split {split!r} in {data_dir} is incomplete: {len(missing)} of its '
      f'{total} shards missing ({shown}{more}); reading the rest would train '
      'or evaluate on part of the data. Copy the missing files, or convert '
      'the images again (python convert.py).')


def _check_recorded(files: Sequence[str], split: str, data_dir: str,
                    shards: List[Shard]) -> None:
  """Raises unless every recorded shard is there with its recorded size."""
  present = {os.path.basename(path): path for path in files}
  for shard in shards:
    name, size = str(shard.get('file')), shard.get('bytes')
    where = f'{name} of split {split!r} in {data_dir}'
    records = shard.get('records')
    wrote = f' ({records} records)' if records is not None else ''
    if name not in present:
      raise ValueError(f'Shard {where} is missing: the converter wrote it'
                       f'{wrote} ({FILENAME}). Copy it, or convert the '
                       'images again (python convert.py).')
    actual = tf.io.gfile.stat(present[name]).length
    if size is not None and actual != size:
      raise ValueError(
          f'Shard {where} holds {actual} bytes, but the converter wrote '
          f'{size}{wrote} ({FILENAME}): cut or changed since, e.g. by an '
          'interrupted copy. Copy it again, or convert the images again '
          '(python convert.py).')


def check_whole(files: Sequence[str], data_dir: str, split: str,
                record: Optional[Dict[str, List[Shard]]] = None) -> None:
  """Raises a one-line ValueError unless `files` are the whole split.

  Args:
    files: the split's shard paths found in `data_dir`.
    data_dir: the folder (its ``splits.json`` is read unless `record`).
    split: the split's name.
    record: the converter's record, if already read.
  """
  _check_numbering(files, split, data_dir)
  shards = (read(data_dir) if record is None else record).get(split)
  if isinstance(shards, list):
    _check_recorded(files, split, data_dir, shards)
