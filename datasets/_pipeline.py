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


def check_drop_remainder(split: str, drop_remainder: Optional[bool],
                         is_training: Optional[bool] = None) -> bool:
  """Resolves `drop_remainder`: default True for training, always False else.

  `is_training` defaults to `split == 'train'`.
  """
  is_training = split == TRAIN if is_training is None else is_training
  if drop_remainder is None:
    return is_training
  if drop_remainder and not is_training:
    raise ValueError(
        f'drop_remainder=True is only allowed for the {TRAIN!r} split (or '
        f'is_training=True), got split {split!r}: evaluation keeps the '
        'final partial batch so every example is seen exactly once. Leave '
        'drop_remainder unset.')
  return bool(drop_remainder)


def map_with_seeds(dataset: tf.data.Dataset, fn, seeded: bool,
                   seed: Optional[int]) -> tf.data.Dataset:
  """`dataset.map(fn)` with `fn(element, seed)` for each element.

  With `seeded`, `seed` is a fresh int64 [2] stateless seed per element
  (a `tf.data.Dataset.random(seed)` stream, so the same `seed` repeats the
  same sequence); without, it is None.
  """
  if not seeded:
    return dataset.map(
        lambda *element: fn(element if len(element) > 1 else element[0],
                            None), num_parallel_calls=tf.data.AUTOTUNE)
  seeds = tf.data.Dataset.random(seed=seed).batch(2, drop_remainder=True)
  return tf.data.Dataset.zip((dataset, seeds)).map(
      fn, num_parallel_calls=tf.data.AUTOTUNE)


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
  return prefetch(dataset)


def prefetch(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """Prefetched, without tf.data's autotune thread.

  That thread sleeps between its optimization rounds (the period doubles
  up to a minute) and a session's close waits for it to wake: Estimator's
  end of training or of an evaluation stood still for 0 to 12 s (train.py
  on digits, 35 s runs). Without it, `AUTOTUNE` parallelism is every core
  (what tuning reaches for image decoding); measured no slower here.
  """
  options = tf.data.Options()
  options.autotune.enabled = False
  return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)
