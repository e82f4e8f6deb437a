"""Random images generated inside the graph, for throughput benchmarks.

One batch of random examples is generated once with stateless random ops,
cached in memory and then handed out again and again, so a step costs no
computation and no copy: the input pipeline never limits a benchmark. Pixels
are uniform in [0, 1); labels are uniform integers in [0, num_classes). The
same `seed` always gives the same data; ``'train'`` and ``'eval'`` use
different random streams. An epoch has `num_examples` examples: full copies
of the batch, then (eval) a partial batch made of its first rows.
"""

from typing import Optional

import tensorflow as tf

from datasets import _pipeline

NAME = 'synthetic'
SPLITS = ('train', 'eval')
DEFAULT_IMAGE_SIZE = 224
DEFAULT_CHANNELS = 3
DEFAULT_NUM_CLASSES = 1000
DEFAULT_NUM_EXAMPLES = {'train': 10000, 'eval': 1000}
DEFAULT_SEED = 0


def _make_example(hw, channels: int, num_classes: int, base_seed: tf.Tensor):
  """Returns a map from an int64 index to a random `(image, label)`."""
  def fn(index):
    seed = tf.stack([base_seed, index])
    image_seed, label_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, num=2))
    image = tf.random.stateless_uniform(
        [hw[0], hw[1], channels], seed=image_seed, dtype=tf.float32)
    label = tf.random.stateless_uniform(
        [], seed=label_seed, minval=0, maxval=num_classes, dtype=tf.int32)
    return image, label
  return fn


def _default(value, default):
  return default if value is None else value


def _one_batch(batch_size: int, base_seed: int, hw, channels: int,
               num_classes: int) -> tf.data.Dataset:
  """A single random batch, generated in parallel once and then cached."""
  make = _make_example(hw, channels, num_classes,
                       tf.constant(base_seed, tf.int64))
  dataset = tf.data.Dataset.range(batch_size)
  dataset = dataset.map(make, num_parallel_calls=tf.data.AUTOTUNE)
  return dataset.batch(batch_size, drop_remainder=True).cache()


def _epoch(batch: tf.data.Dataset, batch_size: int, num_examples: int,
           drop_remainder: bool) -> tf.data.Dataset:
  """`num_examples` examples: repeats of `batch`, then its first rows."""
  full, rest = divmod(num_examples, batch_size)
  dataset = batch.repeat(full)
  if rest and not drop_remainder:
    head = batch.map(lambda images, labels: (images[:rest], labels[:rest]))
    dataset = dataset.concatenate(head)
  return dataset


def synthetic_dataset(split: str, batch_size: int, *,
                      image_size: _pipeline.ImageSize = DEFAULT_IMAGE_SIZE,
                      channels: int = DEFAULT_CHANNELS,
                      num_classes: int = DEFAULT_NUM_CLASSES,
                      num_examples: Optional[int] = None,
                      repeat: Optional[bool] = None,
                      drop_remainder: Optional[bool] = None,
                      seed: Optional[int] = None,
                      is_training: Optional[bool] = None) -> tf.data.Dataset:
  """Builds batches of random `(images, labels)`.

  Args:
    split: ``'train'`` or ``'eval'``.
    batch_size: Examples per batch, >= 1.
    image_size: An int or a (height, width) pair.
    channels: Image channels, >= 1.
    num_classes: Labels are drawn from [0, num_classes).
    num_examples: Examples per epoch; default 10,000 (train), 1,000 (eval).
    repeat: Repeat forever; default True for train only.
    drop_remainder: Drop a final partial batch; default True for train, must
      stay False for eval.
    seed: Integer seed of the data; default 0.
    is_training: Repeated, whole batches; default: split == 'train'.

  Returns:
    A dataset of float32 [B, H, W, C] images and int32 [B] labels.
  """
  _pipeline.check_split(split, SPLITS, NAME)
  batch_size = _pipeline.check_batch_size(batch_size)
  num_examples = _pipeline.check_positive_int('num_examples', _default(
      num_examples, DEFAULT_NUM_EXAMPLES[split]))
  is_training = split == _pipeline.TRAIN if is_training is None else (
      is_training)
  drop_remainder = _pipeline.check_drop_remainder(split, drop_remainder,
                                                  is_training)
  batch = _one_batch(batch_size, 2 * _default(seed, DEFAULT_SEED) +
                     SPLITS.index(split), _pipeline.image_size_hw(image_size),
                     _pipeline.check_positive_int('channels', channels),
                     _pipeline.check_positive_int('num_classes', num_classes))
  dataset = _epoch(batch, batch_size, num_examples, drop_remainder)
  if _default(repeat, is_training):
    dataset = dataset.repeat()
  return _pipeline.prefetch(dataset)
