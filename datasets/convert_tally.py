"""What a conversion wrote and skipped, for its record and its report.

The converter never drops a file silently: a file in a format this
TensorFlow does not decode (TIFF, HEIC, a text file; WebP before 2.21) and
an image that does not decode are counted and named in one WARNING, with
the extensions and a few examples. A class left with no image written is
refused (nothing is moved into place then).
"""

import collections
import os
from typing import Dict, List, Sequence, Tuple

from absl import logging
import tensorflow as tf

from datasets import image_formats
from datasets import split_record

EXAMPLES = 3


def _extension(path: str) -> str:
  return os.path.splitext(path)[1].lower() or '(no extension)'


class Tally:
  """The files of one conversion: skipped (by format, unreadable) and
  written (labels per record file)."""

  def __init__(self, image_dir: str):
    self._image_dir = image_dir
    self._formats: List[Tuple[str, str]] = []  # (path, sniffed kind)
    self._unreadable: List[Tuple[str, str]] = []  # (path, reason)
    self._written: Dict[str, List[int]] = {}  # record file -> labels

  def _name(self, path: str) -> str:
    return os.path.relpath(path, self._image_dir)

  def add_format(self, path: str, kind: str) -> None:
    """Notes a file skipped for its format (`kind`: sniffed, may be '')."""
    self._formats.append((path, kind))

  def add_unreadable(self, path: str, reason: str) -> None:
    """Notes an image skipped because it does not decode."""
    self._unreadable.append((path, reason))

  def note_written(self, path: str, labels: Sequence[int]) -> None:
    """Notes the labels of the records written to `path`."""
    self._written[path] = list(labels)

  def entries(self, paths: Sequence[str]) -> List[split_record.Shard]:
    """`splits.json` entries of written record files, with their counts."""
    entries = split_record.describe(paths)
    for entry, path in zip(entries, paths):
      entry['records'] = len(self._written.get(path, ()))
    return entries

  def decodes_line(self) -> str:
    """E.g. 'TensorFlow 2.15.1 decodes BMP, GIF, JPEG, PNG'."""
    decodable = image_formats.describe(image_formats.decodable_formats())
    line = f'TensorFlow {tf.__version__} decodes {decodable}'
    if any(kind == image_formats.WEBP for _, kind in self._formats):
      line += ' (WebP from TensorFlow 2.21 on)'
    return line

  def formats_line(self) -> str:
    """`decodes_line`, plus the extensions of the files skipped."""
    found = f'; found instead: {self._by_extension()}' if self._formats else ''
    return self.decodes_line() + found

  def _by_extension(self) -> str:
    counts = collections.Counter(_extension(p) for p, _ in self._formats)
    return ', '.join(f'{ext} {n}' for ext, n in counts.most_common())

  def check_every_class_written(self, class_names: Sequence[str]) -> None:
    """Raises for a class none of whose images decoded, naming it."""
    written = {label for labels in self._written.values() for label in labels}
    missing = [name for label, name in enumerate(class_names)
               if label not in written]
    if missing:
      raise ValueError(
          f'class folder(s) {", ".join(missing)} of {self._image_dir} hold '
          f'no image that decodes ({self._unreadable_line()}); nothing was '
          'written. Replace or remove those files and run again.')

  def _unreadable_line(self) -> str:
    shown = '; '.join(f'{self._name(p)}: {reason.rstrip(".")}'
                      for p, reason in self._unreadable[:EXAMPLES])
    more = len(self._unreadable) - EXAMPLES
    return f'{len(self._unreadable)} unreadable, e.g. {shown}' + (
        f' and {more} more' if more > 0 else '')

  def _formats_part(self) -> str:
    shown = ', '.join(self._name(p) for p, _ in self._formats[:EXAMPLES])
    return (f'{len(self._formats)} in other formats ({self._by_extension()};'
            f' e.g. {shown}; {self.decodes_line()})')

  def log(self) -> None:
    """One WARNING naming what was skipped (nothing when nothing was)."""
    parts = ([self._formats_part()] if self._formats else []) + (
        [self._unreadable_line()] if self._unreadable else [])
    if parts:
      total = len(self._formats) + len(self._unreadable) + sum(
          len(labels) for labels in self._written.values())
      logging.warning('Skipped %d of %d files: %s.',
                      len(self._formats) + len(self._unreadable), total,
                      '; '.join(parts))
