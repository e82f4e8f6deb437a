"""Sharded TFRecord files of encoded images, tf-slim style.

Each record is a `tf.train.Example` with the features

* ``image/encoded``: PNG or JPEG bytes,
* ``image/format``: ``b'png'`` or ``b'jpeg'``,
* ``image/class/label``: int64 class id,
* ``image/height``, ``image/width``: int64 size of the encoded image.

A split is stored as ``<data_dir>/<split>-00000-of-0000N.tfrecord`` ...,
next to a ``labels.txt`` holding one ``id:name`` line per class and the
converter's ``splits.json`` (`split_record`: a split is read only whole). The reader
decodes with `tf.io.decode_image`, resizes (bilinear) to the requested size
and scales pixels to [0, 1].
"""

import os
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from datasets import _pipeline
from datasets import record_checks
from datasets import split_record
from preprocessing import preprocessing_factory

NAME = 'tfrecord'
IMAGE_KEY = 'image/encoded'
FORMAT_KEY = 'image/format'
LABEL_KEY = 'image/class/label'
HEIGHT_KEY = 'image/height'
WIDTH_KEY = 'image/width'
LABELS_FILENAME = 'labels.txt'
SHARD_SUFFIX = '.tfrecord'
DEFAULT_CHANNELS = 3
CHANNELS = (1, 3, 4)
DEFAULT_SHUFFLE_BUFFER = 1024
MAX_PARALLEL_READS = 8

_FEATURES = {
    IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
    LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
}
# The kind of each parsed feature in a `tf.train.Example`, checked before
# the first step (record_checks.check_feature_keys).
_FEATURE_KINDS = {IMAGE_KEY: 'bytes_list', LABEL_KEY: 'int64_list'}


def shard_filename(output_dir: str, split: str, index: int,
                   num_shards: int) -> str:
  """Returns e.g. ``<output_dir>/train-00001-of-00004.tfrecord``."""
  name = f'{split}-{index:05d}-of-{num_shards:05d}{SHARD_SUFFIX}'
  return os.path.join(output_dir, name)


def shard_pattern(data_dir: str, split: str) -> str:
  """Returns the glob ``<data_dir>/<split>-*-of-*`` matching a split."""
  return os.path.join(data_dir, f'{split}-*-of-*')


def find_shards(data_dir: Optional[str], split: str) -> List[str]:
  """Lists the record files of a split, sorted.

  Args:
    data_dir: Folder holding the records.
    split: Split name, e.g. ``'train'``.

  Returns:
    The sorted, non-empty list of matching paths.

  Raises:
    ValueError: if `data_dir` is unset, `split` is not a plain name, a
      matching file is empty (0 bytes), or the split is not whole (a
      ``-of-N`` shard missing, or not as the converter recorded it:
      `split_record.check_whole`).
    FileNotFoundError: if `data_dir` is missing or holds no matching file.
  """
  _pipeline.check_split_name(split)
  if not data_dir:
    raise ValueError(
        f'Dataset {NAME!r} needs data_dir: the folder holding the '
        f'{split}-*-of-* record files (see python convert.py).')
  if not tf.io.gfile.isdir(data_dir):
    raise FileNotFoundError(f'data_dir {data_dir!r} is not a directory.')
  files = sorted(tf.io.gfile.glob(shard_pattern(data_dir, split)))
  if not files:
    raise _no_records_error(data_dir, split)
  split_record.check_whole(files, data_dir, split)
  record_checks.check_shards(files)
  return files


def _no_records_error(data_dir: str, split: str) -> FileNotFoundError:
  return FileNotFoundError(
      f'No TFRecord files for split {split!r} in data_dir {data_dir!r}: '
      f'nothing matches {shard_pattern(data_dir, split)!r}. Write them with '
      f'`python convert.py --image_dir DIR '
      f'--output_dir {data_dir} --split {split}` (or hold out part of the '
      'training images as the eval split: `--validation_percentage 10`), '
      'or point data_dir at the folder that holds them.')


def _int64(value: int) -> tf.train.Feature:
  return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def _bytes(value: bytes) -> tf.train.Feature:
  return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def make_example(encoded: bytes, image_format: bytes, label: int,
                 height: int, width: int) -> tf.train.Example:
  """Builds one record's `tf.train.Example` (see the module docstring)."""
  return tf.train.Example(features=tf.train.Features(feature={
      IMAGE_KEY: _bytes(encoded),
      FORMAT_KEY: _bytes(image_format),
      LABEL_KEY: _int64(label),
      HEIGHT_KEY: _int64(height),
      WIDTH_KEY: _int64(width),
  }))


def write_label_file(class_names: Sequence[str], output_dir: str) -> str:
  """Writes ``labels.txt`` with the line ``i:class_names[i]`` per class."""
  path = os.path.join(output_dir, LABELS_FILENAME)
  with tf.io.gfile.GFile(path, 'w') as f:
    f.write(''.join(f'{i}:{name}\n' for i, name in enumerate(class_names)))
  return path


def has_label_file(data_dir: str) -> bool:
  """Whether `data_dir` holds a ``labels.txt``."""
  return tf.io.gfile.exists(os.path.join(data_dir, LABELS_FILENAME))


def read_label_file(data_dir: str) -> Dict[int, str]:
  """Reads ``<data_dir>/labels.txt`` into ``{id: name}``.

  Raises:
    ValueError: on a line that is not ``<int>:<name>``.
  """
  path = os.path.join(data_dir, LABELS_FILENAME)
  with tf.io.gfile.GFile(path, 'r') as f:
    lines = f.read().splitlines()
  labels = {}
  for number, line in enumerate(lines, start=1):
    if line.strip():
      labels.update([_parse_label_line(line, path, number)])
  return labels


def _parse_label_line(line: str, path: str, number: int) -> Tuple[int, str]:
  label, sep, name = line.partition(':')
  if not sep or not label.strip().isdigit():
    raise ValueError(f'{path}:{number}: expected "<id>:<name>", got {line!r}.')
  return int(label), name


def count_records(data_dir: str, split: str,
                  at_most: Optional[int] = None) -> int:
  """The number of records of a split (reads every shard once), or, with
  `at_most`, min(that, `at_most`), reading no further.

  Raises:
    ValueError: a shard cannot be read (naming it).
  """
  files = find_shards(data_dir, split)
  limit = -1 if at_most is None else at_most
  with tf.Graph().as_default():
    path = tf.compat.v1.placeholder(tf.string, [])
    take = tf.compat.v1.placeholder(tf.int64, [])
    count = tf.data.TFRecordDataset(path).take(take).reduce(
        tf.constant(0, tf.int64), lambda total, _: total + 1)
    with tf.compat.v1.Session() as session:
      total = 0
      for name in files:
        if limit >= 0 and total >= limit:
          break
        total += _count(session, count, {path: name, take: (
            limit - total if limit >= 0 else -1)}, name)
      return total


def _count(session, count: tf.Tensor, feed: dict, name: str) -> int:
  try:
    return int(session.run(count, feed))
  except tf.errors.OpError as error:
    reason = record_checks.op_error_reason(error)
    raise ValueError(
        f'Cannot count the records of {name} ({reason}); rewrite the '
        'damaged shard with python convert.py.') from error


def _check_channels(channels: int) -> int:
  if channels not in CHANNELS:
    raise ValueError(
        f'channels must be one of {CHANNELS} (grayscale, RGB, RGBA), got '
        f'{channels!r}.')
  return channels


def _decoder(hw: Tuple[int, int], channels: int, num_classes: Optional[int],
             preprocess_fn=preprocessing_factory.get_preprocessing(
                 preprocessing_factory.DEFAULT_NAME), labels_offset: int = 0):
  """Returns the map from `((file, index, serialized Example), seed)` to
  `(image, label)`; a bad image or label fails naming the file and index.

  `preprocess_fn` (default: resize) sizes the image; the stored label minus
  `labels_offset` is the class.
  """
  def fn(record, seed=None):
    path, index, serialized = record
    features = tf.io.parse_single_example(serialized, _FEATURES)
    encoded = record_checks.check_image_bytes(features[IMAGE_KEY], path,
                                              index)
    image = tf.io.decode_image(encoded, channels=channels,
                               expand_animations=False)
    image = preprocess_fn(tf.cast(image, tf.float32), hw[0], hw[1], seed)
    image.set_shape([hw[0], hw[1], channels])
    label = tf.cast(features[LABEL_KEY], tf.int32) - labels_offset
    if num_classes is not None:
      label = record_checks.check_label(label, num_classes, path, index,
                                         labels_offset)
    return image * (1.0 / 255.0), label
  return fn


def _read_records(data_dir: str, split: str, num_files: int, shuffle: bool,
                  seed: Optional[int]) -> tf.data.Dataset:
  """Interleaves the serialized records of all shards, reading in parallel."""
  files = tf.data.Dataset.list_files(
      shard_pattern(data_dir, split), shuffle=shuffle, seed=seed)
  return files.interleave(
      record_checks.with_file_and_index,
      cycle_length=min(num_files, MAX_PARALLEL_READS),
      num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=not shuffle or seed is not None)


def tfrecord_dataset(data_dir: str, split: str, batch_size: int, *,
                     image_size: _pipeline.ImageSize,
                     channels: int = DEFAULT_CHANNELS,
                     num_classes: Optional[int] = None,
                     shuffle: Optional[bool] = None,
                     repeat: Optional[bool] = None,
                     drop_remainder: Optional[bool] = None,
                     seed: Optional[int] = None,
                     shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
                     is_training: Optional[bool] = None,
                     preprocessing_name: str = preprocessing_factory.DEFAULT_NAME,
                     labels_offset: int = 0) -> tf.data.Dataset:
  """Builds batches of `(images, labels)` from a split's record files.

  Args:
    data_dir: Folder with ``<split>-*-of-*`` files.
    split: Split name (letters, digits, underscores), e.g. ``'train'``.
    batch_size: Examples per batch, >= 1.
    image_size: Output size, an int or (height, width); images are resized.
    channels: Channels to decode to (1: grayscale, 3: RGB).
    num_classes: If given, labels are checked in-graph to be below it.
    shuffle: Shuffle files and records; default True for train only.
    repeat: Repeat forever; default True for train only.
    drop_remainder: Drop a final partial batch; default True for train, must
      stay False for other splits.
    seed: Shuffle seed; with it the order is reproducible.
    shuffle_buffer: Serialized records held in the shuffle buffer.
    is_training: Training input: shuffled, repeated, whole batches and the
      training variant of the preprocessing; default: split == 'train'.
    preprocessing_name: One of `preprocessing_factory.PREPROCESSING_NAMES`.
    labels_offset: Subtracted from the stored labels (tf-slim's flag: 1
      drops ImageNet's background class 0); `num_classes` counts the
      classes after it.

  Returns:
    A dataset of float32 [B, H, W, channels] images in [0, 1] and int32 [B]
    labels.
  """
  batch_size = _pipeline.check_batch_size(batch_size)
  hw = _pipeline.image_size_hw(image_size)
  _check_channels(channels)
  if num_classes is not None:
    _pipeline.check_positive_int('num_classes', num_classes)
  files = find_shards(data_dir, split)
  record_checks.check_feature_keys(files, _FEATURE_KINDS)
  record_checks.remember(files)
  is_train = split == _pipeline.TRAIN if is_training is None else is_training
  shuffle = is_train if shuffle is None else shuffle
  drop_remainder = _pipeline.check_drop_remainder(split, drop_remainder,
                                                  is_train)
  dataset = _pipeline.shuffle_repeat(
      _read_records(data_dir, split, len(files), shuffle, seed),
      shuffle=shuffle, repeat=is_train if repeat is None else repeat,
      shuffle_buffer=shuffle_buffer, seed=seed)
  dataset = _pipeline.map_with_seeds(
      dataset, _decoder(hw, channels, num_classes,
                        preprocessing_factory.get_preprocessing(preprocessing_name,
                                                        is_train),
                        labels_offset),
      preprocessing_factory.is_random(preprocessing_name, is_train), seed)
  return _pipeline.batch_prefetch(dataset, batch_size, drop_remainder)
