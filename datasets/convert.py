"""Converts a folder of images, one subfolder per class, to sharded records.

Class ids follow the sorted subfolder names. PNG and JPEG files are stored as
they are (after checking that they decode); BMP and GIF are re-encoded as PNG.
The output is ``<output_dir>/<split>-0000i-of-0000N.tfrecord`` plus
``labels.txt``; see `datasets.tfrecord` for the format.

Every subfolder is a class (as in tf-slim's converters), so a subfolder
without images is refused, naming it, rather than becoming a class that no
image teaches. The command line is the script `convert.py` beside train.py::

  python convert.py --image_dir photos/ \\
      --output_dir records/ --num_shards 4 --validation_percentage 10

writes the `train` split and holds 10% of each class out as the `eval`
split, which eval.py reads by default.
"""

import os
import random
import sys
from typing import List, Sequence, Tuple

from absl import logging
import numpy as np
import tensorflow as tf

from datasets import _pipeline
from datasets import tfrecord

tf1 = tf.compat.v1

IMAGE_EXTENSIONS = ('.png', '.jpg', '.jpeg', '.bmp', '.gif')
_MAGIC = ((b'\x89PNG\r\n\x1a\n', b'png'), (b'\xff\xd8\xff', b'jpeg'))

Item = Tuple[str, int]


def _subfolders(image_dir: str) -> List[str]:
  if not tf.io.gfile.isdir(image_dir):
    raise FileNotFoundError(f'image_dir {image_dir!r} is not a directory.')
  names = tf.io.gfile.listdir(image_dir)
  return sorted(n.rstrip('/') for n in names
                if tf.io.gfile.isdir(os.path.join(image_dir, n)))


def _images_in(folder: str) -> List[str]:
  names = sorted(tf.io.gfile.listdir(folder))
  return [os.path.join(folder, n) for n in names
          if n.lower().endswith(IMAGE_EXTENSIONS)]


def list_image_folder(image_dir: str) -> Tuple[List[Item], List[str]]:
  """Finds the images of a one-subfolder-per-class folder.

  Args:
    image_dir: Folder whose subfolders are named after the classes.

  Returns:
    `(items, class_names)`: `(path, label)` pairs in sorted order and the
    sorted class names, where label `i` is `class_names[i]`.

  Raises:
    FileNotFoundError: if `image_dir` is missing.
    ValueError: if it has no class subfolder, no image in them, or a class
      subfolder without images.
  """
  class_names = _subfolders(image_dir)
  if not class_names:
    raise ValueError(
        f'image_dir {image_dir!r} has no subfolders; expected one subfolder '
        'of images per class, e.g. image_dir/cat/1.png, image_dir/dog/2.png.')
  images = {name: _images_in(os.path.join(image_dir, name))
            for name in class_names}
  if not any(images.values()):
    raise ValueError(f'No image files {IMAGE_EXTENSIONS} in the subfolders '
                     f'{class_names} of {image_dir!r}.')
  _check_no_empty_class(image_dir, images)
  return [(path, label) for label, name in enumerate(class_names)
          for path in images[name]], class_names


def _check_no_empty_class(image_dir: str, images: dict) -> None:
  """Raises for class subfolders that hold no image (naming them)."""
  empty = [os.path.join(image_dir, name) for name, paths in images.items()
           if not paths]
  if empty:
    raise ValueError(
        f'class folder(s) {", ".join(empty)} hold no image file '
        f'({", ".join(IMAGE_EXTENSIONS)}): every subfolder of image_dir is a '
        'class, and an empty one would be a class that no image teaches. '
        'Add its images, or move the folder out of image_dir.')


def sniff_format(data: bytes) -> bytes:
  """Returns ``b'png'``/``b'jpeg'`` from the magic bytes, else ``b''``."""
  for magic, image_format in _MAGIC:
    if data.startswith(magic):
      return image_format
  return b''


class ImageCoder:
  """Checks and re-encodes images in a graph of its own.

  Using a private graph and session makes the converter work the same
  whether or not the caller runs eagerly. Use as a context manager.
  """

  def __init__(self):
    self._graph = tf.Graph()
    with self._graph.as_default():
      self._data = tf1.placeholder(tf.string, [])
      image = tf.io.decode_image(self._data, expand_animations=False)
      self._shape = tf.shape(image)
      self._png = tf.io.encode_png(image)
    self._session = tf1.Session(graph=self._graph)

  def __enter__(self) -> 'ImageCoder':
    return self

  def __exit__(self, *exc_info) -> None:
    self._session.close()

  def encode(self, data: bytes) -> Tuple[bytes, bytes, int, int]:
    """Returns `(encoded, format, height, width)` for raw image file bytes."""
    image_format = sniff_format(data)
    if image_format:
      shape = self._session.run(self._shape, {self._data: data})
      return data, image_format, int(shape[0]), int(shape[1])
    png, shape = self._session.run([self._png, self._shape], {self._data: data})
    return png, b'png', int(shape[0]), int(shape[1])


def _serialize(coder: ImageCoder, path: str, label: int) -> bytes:
  with tf.io.gfile.GFile(path, 'rb') as f:
    data = f.read()
  try:
    encoded, image_format, height, width = coder.encode(data)
  except tf.errors.InvalidArgumentError as e:
    raise ValueError(f'Cannot decode image {path!r}: {e.message}') from e
  example = tfrecord.make_example(encoded, image_format, label, height, width)
  return example.SerializeToString()


def write_shards(items: Sequence[Item], output_dir: str, split: str,
                 num_shards: int) -> List[str]:
  """Writes `items` in order into `num_shards` contiguous record files."""
  paths = []
  with ImageCoder() as coder:
    for index, chunk in enumerate(np.array_split(np.arange(len(items)),
                                                 num_shards)):
      path = tfrecord.shard_filename(output_dir, split, index, num_shards)
      with tf.io.TFRecordWriter(path) as writer:
        for i in chunk:
          writer.write(_serialize(coder, *items[i]))
      logging.info('Wrote %d images to %s', len(chunk), path)
      paths.append(path)
  return paths


def _clear_old_shards(output_dir: str, split: str, overwrite: bool) -> None:
  """Refuses to mix with, or (if `overwrite`) deletes, a split's old files."""
  pattern = tfrecord.shard_pattern(output_dir, split)
  old = tf.io.gfile.glob(pattern)
  if old and not overwrite:
    raise FileExistsError(
        f'{len(old)} file(s) already match {pattern!r}; they would be read '
        'together with the new ones. Pass overwrite=True (--overwrite) to '
        'replace them, or choose another output_dir (--output_dir).')
  for path in old:
    tf.io.gfile.remove(path)


def _write_labels(class_names: List[str], output_dir: str) -> None:
  """Writes labels.txt, refusing to change one another split wrote."""
  if tfrecord.has_label_file(output_dir):
    existing = tfrecord.read_label_file(output_dir)
    if existing != dict(enumerate(class_names)):
      raise ValueError(
          f'{output_dir}/{tfrecord.LABELS_FILENAME} lists classes '
          f'{sorted(existing.values())} but the image folder has '
          f'{class_names}; every split of one output_dir must share classes.')
  tfrecord.write_label_file(class_names, output_dir)


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


def convert_image_folder(image_dir: str, output_dir: str, split: str = 'train',
                         num_shards: int = 1, *, shuffle: bool = True,
                         seed: int = 0, overwrite: bool = False,
                         validation_percentage: float = 0.0,
                         validation_split: str = 'eval') -> List[str]:
  """Converts a one-subfolder-per-class image folder to sharded records.

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

  Returns:
    The paths of the record files written.
  """
  _pipeline.check_split_name(split)
  _pipeline.check_positive_int('num_shards', num_shards)
  items, class_names = list_image_folder(image_dir)
  if num_shards > len(items):
    raise ValueError(f'num_shards={num_shards} exceeds the {len(items)} '
                     f'images in {image_dir!r}; use at most {len(items)}.')
  if shuffle:
    random.Random(seed).shuffle(items)
  items, held = hold_out(items, validation_percentage)
  splits = [(split, items)] + ([(validation_split, held)] if held else [])
  tf.io.gfile.makedirs(output_dir)
  for name, _ in splits:
    _pipeline.check_split_name(name)
    _clear_old_shards(output_dir, name, overwrite)
  _write_labels(class_names, output_dir)
  logging.info('Converting %d images of %d classes from %s', len(items) +
               len(held), len(class_names), image_dir)
  return [path for name, chunk in splits for path in write_shards(
      chunk, output_dir, name, min(num_shards, len(chunk)))]


if __name__ == '__main__':
  sys.stderr.write('datasets.convert: error: the converter is a script now, '
                   'beside train.py: run python convert.py --image_dir=DIR '
                   '--output_dir=DIR (same flags).\n')
  sys.exit(2)
