"""Converts a folder of images, one subfolder per class, to sharded records.

Class ids follow the sorted subfolder names. A file's format comes from its
first bytes; every format the installed TensorFlow decodes converts (BMP,
GIF, JPEG, PNG, and WebP from TensorFlow 2.21 on: `image_formats`). PNG and
JPEG files are stored as they are, the others re-encoded as PNG; a photo
with an EXIF orientation is stored upright (`exif`), re-encoded in its own
format (JPEG at quality 95). Files in other formats (TIFF, HEIC, text) and
files that do not decode are skipped, counted and named in one WARNING.

All or nothing: the shards, ``labels.txt`` and ``splits.json`` (each
split's shards with their record counts and sizes, `split_record`) are
written into a temporary folder inside `output_dir` and moved into place
only when every split is written, so a failure leaves `output_dir` as it
was and a rerun needs no ``--overwrite``. The output is
``<output_dir>/<split>-0000i-of-0000N.tfrecord``; see `datasets.tfrecord`.

Every subfolder is a class (as in tf-slim's converters), so a subfolder
without a readable image is refused, naming it, rather than becoming a
class that no image teaches. The command line is the script `convert.py`
beside train.py::

  python convert.py --image_dir photos/ \\
      --output_dir records/ --num_shards 4 --validation_percentage 10

writes the `train` split and holds 10% of each class out as the `eval`
split, which eval.py reads by default.
"""

import os
import random
import sys
from typing import Dict, List, Optional, Sequence, Tuple
import uuid

from absl import logging
import numpy as np
import tensorflow as tf

from datasets import _pipeline
from datasets import convert_tally
from datasets import exif
from datasets import image_folder
from datasets import image_formats
from datasets import record_checks
from datasets import split_record
from datasets import tfrecord

tf1 = tf.compat.v1

STAGING_PREFIX = '.convert-'
JPEG_QUALITY = 95

Item = image_folder.Item


def sniff_format(data: bytes) -> bytes:
  """Returns ``b'png'``/``b'jpeg'`` from the magic bytes, else ``b''``."""
  kind = image_formats.sniff(data[:image_formats.HEADER_BYTES])
  return kind.encode() if kind in image_formats.STORED_AS_IS else b''


class ImageCoder:
  """Checks, turns upright and re-encodes images in a graph of its own.

  Using a private graph and session makes the converter work the same
  whether or not the caller runs eagerly. Use as a context manager.
  """

  def __init__(self):
    self._graph = tf.Graph()
    with self._graph.as_default():
      self._data = tf1.placeholder(tf.string, [])
      self._image = tf.io.decode_image(self._data, expand_animations=False)
      self._pixels = tf1.placeholder(tf.uint8, [None, None, None])
      self._png = tf.io.encode_png(self._pixels)
      self._jpeg = tf.io.encode_jpeg(self._pixels, quality=JPEG_QUALITY)
    self._session = tf1.Session(graph=self._graph)

  def __enter__(self) -> 'ImageCoder':
    return self

  def __exit__(self, *exc_info) -> None:
    self._session.close()

  def encode(self, data: bytes) -> Tuple[bytes, bytes, int, int]:
    """Returns `(encoded, format, height, width)` for raw image file bytes.

    Raises:
      tf.errors.InvalidArgumentError: the bytes do not decode.
    """
    image_format = sniff_format(data)
    turn = exif.orientation(data)
    image = self._session.run(self._image, {self._data: data})
    if image_format and turn == exif.UPRIGHT:
      return data, image_format, int(image.shape[0]), int(image.shape[1])
    image = exif.upright(image, turn)
    encoder = self._jpeg if image_format == b'jpeg' else self._png
    encoded = self._session.run(encoder, {self._pixels: image})
    return (encoded, image_format or b'png', int(image.shape[0]),
            int(image.shape[1]))


def _serialize(coder: ImageCoder, path: str, label: int) -> bytes:
  """The record of one image (ValueError: it does not decode)."""
  with tf.io.gfile.GFile(path, 'rb') as f:
    data = f.read()
  try:
    encoded, image_format, height, width = coder.encode(data)
  except tf.errors.InvalidArgumentError as e:
    raise ValueError(record_checks.op_error_reason(e)) from e
  example = tfrecord.make_example(encoded, image_format, label, height, width)
  return example.SerializeToString()


def _write_shard(coder: ImageCoder, items: Sequence[Item], path: str,
                 tally: convert_tally.Tally) -> List[int]:
  """Writes `items` to one record file; returns the labels written."""
  labels = []
  with tf.io.TFRecordWriter(path) as writer:
    for image_path, label in items:
      try:
        writer.write(_serialize(coder, image_path, label))
        labels.append(label)
      except ValueError as error:
        tally.add_unreadable(image_path, str(error))
  return labels


def write_shards(items: Sequence[Item], output_dir: str, split: str,
                 num_shards: int,
                 tally: Optional[convert_tally.Tally] = None) -> List[str]:
  """Writes `items` in order into `num_shards` contiguous record files,
  skipping (into `tally`) images that do not decode.

  Returns:
    The paths written; `tally` notes each one's labels and the images
    skipped.
  """
  tally = tally or convert_tally.Tally(output_dir)
  paths = []
  with ImageCoder() as coder:
    for index, chunk in enumerate(np.array_split(np.arange(len(items)),
                                                 num_shards)):
      path = tfrecord.shard_filename(output_dir, split, index, num_shards)
      labels = _write_shard(coder, [items[i] for i in chunk], path, tally)
      tally.note_written(path, labels)
      logging.info('Wrote %d image%s to %s', len(labels),
                   '' if len(labels) == 1 else 's', os.path.basename(path))
      paths.append(path)
  return paths


def _check_old_shards(output_dir: str, split: str, overwrite: bool
                      ) -> List[str]:
  """A split's files written before (refused unless `overwrite`)."""
  pattern = tfrecord.shard_pattern(output_dir, split)
  old = tf.io.gfile.glob(pattern)
  if old and not overwrite:
    raise FileExistsError(
        f'{len(old)} file(s) already match {pattern!r}; they would be read '
        'together with the new ones. Pass overwrite=True (--overwrite) to '
        'replace them, or choose another output_dir (--output_dir).')
  return old


def _check_labels(class_names: List[str], output_dir: str) -> None:
  """Refuses to change the labels.txt another split wrote."""
  if tfrecord.has_label_file(output_dir):
    existing = tfrecord.read_label_file(output_dir)
    if existing != dict(enumerate(class_names)):
      raise ValueError(
          f'{output_dir}/{tfrecord.LABELS_FILENAME} lists classes '
          f'{sorted(existing.values())} but the image folder has '
          f'{class_names}; every split of one output_dir must share classes.')


def hold_out(items: Sequence[Item], percentage: float) -> Tuple[List[Item],
                                                                 List[Item]]:
  """(kept, held out): `percentage` % of each class's images held out
  (rounded; at least one when the class has two or more), in order.

  Raises:
    ValueError: `percentage` outside [0, 100).
  """
  if not 0 <= percentage < 100:
    raise ValueError(f'validation_percentage={percentage:g}: expected a '
                     'percentage in [0, 100), e.g. 10.')
  counts, kept, held = {}, [], []
  for path, label in items:
    counts.setdefault(label, []).append((path, label))
  for group in counts.values():
    size = round(len(group) * percentage / 100)
    if percentage and len(group) > 1:
      size = min(max(size, 1), len(group) - 1)
    held += group[:size]
    kept += group[size:]
  return kept, held


def _remove_stale_staging(output_dir: str) -> None:
  """Removes the temporary folders of converter runs that were killed."""
  for name in tf.io.gfile.listdir(output_dir):
    if name.rstrip('/').startswith(STAGING_PREFIX):
      logging.info('Removing %s, left by an interrupted conversion', name)
      tf.io.gfile.rmtree(os.path.join(output_dir, name.rstrip('/')))


def _plan_splits(scan: image_folder.Scan, split: str, num_shards: int, shuffle: bool,
                 seed: int, validation_percentage: float,
                 validation_split: str) -> List[Tuple[str, List[Item]]]:
  """[(split name, its items)]: the training split and the held-out one."""
  items = list(scan.items)
  if num_shards > len(items):
    raise ValueError(f'num_shards={num_shards} exceeds the {len(items)} '
                     f'images in the folder; use at most {len(items)}.')
  if shuffle:
    random.Random(seed).shuffle(items)
  items, held = hold_out(items, validation_percentage)
  splits = [(split, items)] + ([(validation_split, held)] if held else [])
  for name, _ in splits:
    _pipeline.check_split_name(name)
  return splits


def _stage(scan: image_folder.Scan, splits, staging: str, num_shards: int,
           output_dir: str) -> Dict[str, List[str]]:
  """Writes every split, labels.txt and splits.json into `staging`."""
  written = {name: write_shards(chunk, staging, name,
                                min(num_shards, len(chunk)), scan.tally)
             for name, chunk in splits}
  scan.tally.check_every_class_written(scan.class_names)
  tfrecord.write_label_file(scan.class_names, staging)
  record = split_record.read(output_dir)
  for name, paths in written.items():
    record[name] = scan.tally.entries(paths)
  split_record.write(os.path.join(staging, split_record.FILENAME), record)
  return written


def _publish(staging: str, output_dir: str, written: Dict[str, List[str]],
             old: List[str]) -> List[str]:
  """Moves the staged files into `output_dir` (replacing `old`)."""
  for path in old:
    tf.io.gfile.remove(path)
  moved = []
  for paths in written.values():
    for path in paths:
      moved.append(os.path.join(output_dir, os.path.basename(path)))
      tf.io.gfile.rename(path, moved[-1])
  for name in (tfrecord.LABELS_FILENAME, split_record.FILENAME):
    tf.io.gfile.rename(os.path.join(staging, name),
                       os.path.join(output_dir, name), overwrite=True)
  return moved


def _check_classes(scan: image_folder.Scan, image_dir: str,
                   min_classes: int) -> None:
  """Raises when the folder has fewer classes than `min_classes`."""
  if len(scan.class_names) >= min_classes:
    return
  names = ', '.join(scan.class_names)
  one = 'one class subfolder' if len(scan.class_names) == 1 else (
      f'{len(scan.class_names)} class subfolders')
  raise ValueError(
      f'image_dir {image_dir} has {one}, {names} ({len(scan.items)} images): '
      f'a classifier needs two or more (at least {min_classes}), or every '
      'prediction is right (accuracy 1.0) and it learns nothing. Add a '
      f'subfolder of images for each other class, e.g. {image_dir}/other/, '
      'and convert again.')


def convert_image_folder(image_dir: str, output_dir: str, split: str = 'train',
                         num_shards: int = 1, *, shuffle: bool = True,
                         seed: int = 0, overwrite: bool = False,
                         validation_percentage: float = 0.0,
                         validation_split: str = 'eval',
                         min_classes: int = 2) -> List[str]:
  """Converts a one-subfolder-per-class image folder to sharded records,
  all or nothing (see the module docstring).

  Args:
    image_dir: Folder with one subfolder of images per class.
    output_dir: Where records and ``labels.txt`` go (created if needed).
    split: Split name used in the file names, e.g. ``'train'``.
    num_shards: Number of record files, 1 <= num_shards <= number of images.
    shuffle: Mix the images across shards (fixed order for a given `seed`).
    seed: Seed of that shuffle.
    overwrite: Replace files of this split already in `output_dir`.
    validation_percentage: Hold out this percentage of each class's images
      (as TensorFlow's image-retraining example) into `validation_split`,
      the split eval.py reads by default; 0: none.
    validation_split: The held-out split's name.
    min_classes: Fewer class subfolders are refused: with one, every label
      is 0 and a classifier is right whatever it predicts (1 converts one
      class, e.g. to try a format).

  Returns:
    The paths of the record files written.
  """
  _pipeline.check_split_name(split)
  _pipeline.check_positive_int('num_shards', num_shards)
  scan = image_folder.scan_image_folder(image_dir)
  _check_classes(scan, image_dir, min_classes)
  splits = _plan_splits(scan, split, num_shards, shuffle, seed,
                        validation_percentage, validation_split)
  tf.io.gfile.makedirs(output_dir)
  old = [path for name, _ in splits
         for path in _check_old_shards(output_dir, name, overwrite)]
  _check_labels(scan.class_names, output_dir)
  _remove_stale_staging(output_dir)
  logging.info('Converting %d images of %d classes from %s',
               len(scan.items), len(scan.class_names), image_dir)
  staging = os.path.join(output_dir, STAGING_PREFIX + uuid.uuid4().hex[:8])
  tf.io.gfile.makedirs(staging)
  try:
    written = _stage(scan, splits, staging, num_shards, output_dir)
    scan.tally.log()
    return _publish(staging, output_dir, written, old)
  finally:
    tf.io.gfile.rmtree(staging)


if __name__ == '__main__':
  sys.stderr.write('datasets.convert: error: the converter is a script now, '
                   'beside train.py: run python convert.py --image_dir=DIR '
                   '--output_dir=DIR (same flags).\n')
  sys.exit(2)
