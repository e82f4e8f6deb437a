"""Argument checks and the shared shuffle/repeat/batch/prefetch tail."""

import numbers
import re
from typing import Optional, Sequence, Tuple, Union

import tensorflow as tf

ImageSize = Union[int, Sequence[int]]

TRAIN = 'train'
_SPLIT_RE = re.compile(r'^[A-Za-z0-9_]+$')


def _is_int(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_batch_size(batch_size: int) -> int:
  """Returns `batch_size` as an int, or raises a ValueError saying why."""
  if not _is_int(batch_size) or batch_size < 1:
    raise ValueError(
        f'batch_size must be an integer >= 1, got {batch_size!r}. Pass the '
        'number of examples per batch, e.g. batch_size=32.')
  return int(batch_size)


def check_positive_int(name: str, value: int) -> int:
  """Returns `value` as an int if it is an integer >= 1, else raises."""
  if not _is_int(value) or value < 1:
    raise ValueError(f'{name} must be an integer >= 1, got {value!r}.')
  return int(value)


def image_size_hw(image_size: ImageSize) -> Tuple[int, int]:
  """Normalises an image size given as `N` or `(height, width)` to a pair.

  Args:
    image_size: A positive int (square images) or a pair of positive ints.

  Returns:
    `(height, width)` as Python ints.

  Raises:
    ValueError: if `image_size` is not of one of those forms.
  """
  pair = (image_size, image_size) if _is_int(image_size) else image_size
  if (isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or
      len(pair) != 2 or not all(_is_int(v) and v >= 1 for v in pair)):
    raise ValueError(
        f'image_size must be a positive int or a (height, width) pair of '
        f'positive ints, got {image_size!r}. Example: image_size=224 or '
        'image_size=(32, 48).')
  return int(pair[0]), int(pair[1])


def check_split(split: str, valid: Sequence[str], dataset: str) -> str:
  """Raises a ValueError unless `split` is one of `valid`."""
  if split not in valid:
    raise ValueError(
        f'Unknown split {split!r} for dataset {dataset!r}; expected one of '
        f'{", ".join(repr(s) for s in valid)}.')
  return split


def check_split_name(split: str) -> str:
  """Raises a ValueError unless `split` can name record files safely."""
  if not isinstance(split, str) or not _SPLIT_RE.match(split):
    raise ValueError(
        f'Bad split name {split!r}: use letters, digits and underscores only '
        "(e.g. 'train', 'eval', 'validation'); it names the record files "
        '<split>-NNNNN-of-NNNNN.tfrecord.')
  return split


def check_drop_remainder(split: str, drop_remainder: Optional[bool]) -> bool:
  """Resolves `drop_remainder`: default True for train, always False else."""
  if drop_remainder is None:
    return split == TRAIN
  if drop_remainder and split != TRAIN:
    raise ValueError(
        f'drop_remainder=True is only allowed for the {TRAIN!r} split, got '
        f'split {split!r}: evaluation keeps the final partial batch so every '
        'example is seen exactly once. Leave drop_remainder unset.')
  return bool(drop_remainder)


def shuffle_repeat(dataset: tf.data.Dataset, *, shuffle: bool, repeat: bool,
                   shuffle_buffer: int,
                   seed: Optional[int]) -> tf.data.Dataset:
  """Shuffles (afresh each epoch) and then repeats forever, as asked."""
  if shuffle:
    dataset = dataset.shuffle(shuffle_buffer, seed=seed,
                              reshuffle_each_iteration=True)
  return dataset.repeat() if repeat else dataset


def batch_prefetch(dataset: tf.data.Dataset, batch_size: int,
                   drop_remainder: bool) -> tf.data.Dataset:
  """Batches and prefetches; the last step of every pipeline here."""
  dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
  return dataset.prefetch(tf.data.AUTOTUNE)


def resize_to(image: tf.Tensor, hw: Tuple[int, int]) -> tf.Tensor:
  """Bilinearly resizes `image` to `hw`, leaving it alone if already that."""
  static = image.shape[-3:-1]
  if static.is_fully_defined() and tuple(static.as_list()) == hw:
    return image
  return tf.image.resize(image, hw, method=tf.image.ResizeMethod.BILINEAR)
