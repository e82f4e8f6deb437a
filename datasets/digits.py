"""The 8x8 handwritten digits bundled with scikit-learn, as a tf.data input.

`sklearn.datasets.load_digits()` ships inside scikit-learn (nothing is
downloaded): 1,797 grayscale 8x8 images of the digits 0-9 with pixel values
0-16. They are split once, stratified by class with a fixed seed, into

* ``'train'``: 1,437 images (80 %),
* ``'eval'``: 360 images (20 %, held out),

so that every class appears in both splits and the split never changes.
Images are scaled to [0, 1] float32 of shape [8, 8, 1].
"""

import functools
from typing import Optional, Tuple

import numpy as np
import tensorflow as tf

from datasets import _pipeline
from preprocessing import preprocessing_factory

NAME = 'digits'
NUM_CLASSES = 10
IMAGE_SIZE = 8
SPLITS = ('train', 'eval')
SPLIT_SIZES = {'train': 1437, 'eval': 360}
SPLIT_SEED = 0
EVAL_FRACTION = 0.2
MAX_PIXEL = 16.0  # pixel values are 0..16.
_MAX_PIXEL = MAX_PIXEL


@functools.lru_cache(maxsize=None)
def _load():
  """Returns scikit-learn's bundled digits (read from its own package)."""
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  return datasets.load_digits()


@functools.lru_cache(maxsize=None)
def _split_indices() -> Tuple[np.ndarray, np.ndarray]:
  """Returns sorted (train, eval) indices of the fixed stratified split."""
  from sklearn import model_selection  # pylint: disable=g-import-not-at-top
  labels = _load().target
  train, held_out = model_selection.train_test_split(
      np.arange(len(labels)), test_size=EVAL_FRACTION,
      random_state=SPLIT_SEED, stratify=labels)
  return np.sort(train), np.sort(held_out)


def split_indices(split: str) -> np.ndarray:
  """Sorted indices into `load_digits()` of the examples in `split`."""
  _pipeline.check_split(split, SPLITS, NAME)
  return _split_indices()[SPLITS.index(split)]


def load_split(split: str) -> Tuple[np.ndarray, np.ndarray]:
  """Loads one split as numpy arrays.

  Args:
    split: ``'train'`` or ``'eval'``.

  Returns:
    `(images, labels)`: uint8 [N, 8, 8, 1] with values 0-16 and int32 [N].
  """
  bunch = _load()
  index = split_indices(split)
  images = bunch.images[index].astype(np.uint8)[..., np.newaxis]
  return images, bunch.target[index].astype(np.int32)


def _preprocess(hw: Tuple[int, int], preprocess_fn):
  """Returns the per-example map: scale to [0, 1], then `preprocess_fn`."""
  def fn(example, seed):
    image, label = example
    image = tf.cast(image, tf.float32) * (1.0 / _MAX_PIXEL)
    return preprocess_fn(image, hw[0], hw[1], seed), label
  return fn


def digits_dataset(split: str, batch_size: int, *,
                   image_size: Optional[_pipeline.ImageSize] = None,
                   shuffle: Optional[bool] = None,
                   repeat: Optional[bool] = None,
                   drop_remainder: Optional[bool] = None,
                   seed: Optional[int] = None,
                   is_training: Optional[bool] = None,
                   preprocessing_name: str = preprocessing_factory.DEFAULT_NAME
                   ) -> tf.data.Dataset:
  """Builds batches of `(images, labels)` from the digits split.

  Args:
    split: ``'train'`` or ``'eval'``.
    batch_size: Examples per batch, >= 1.
    image_size: Output size; default 8 (native). Other sizes are bilinear
      resizes of the 8x8 images.
    shuffle: Shuffle each epoch; default True for train only.
    repeat: Repeat forever; default True for train only.
    drop_remainder: Drop a final partial batch; default True for train, must
      stay False for eval.
    seed: Shuffle (and augmentation) seed (None: not reproducible).
    is_training: Training input: shuffled, repeated, whole batches and the
      training variant of the preprocessing; default: split == 'train'.
    preprocessing_name: `preprocessing_factory.PREPROCESSING_NAMES` but
      'crop_flip' (a mirrored digit is another shape).

  Returns:
    A dataset of float32 [B, H, W, 1] images in [0, 1] and int32 [B] labels.
  """
  batch_size = _pipeline.check_batch_size(batch_size)
  hw = _pipeline.image_size_hw(IMAGE_SIZE if image_size is None else image_size)
  images, labels = load_split(split)
  is_train = split == _pipeline.TRAIN if is_training is None else is_training
  drop_remainder = _pipeline.check_drop_remainder(split, drop_remainder,
                                                  is_train)
  preprocessing_factory.check_for_dataset(preprocessing_name, NAME)
  dataset = _pipeline.shuffle_repeat(
      tf.data.Dataset.from_tensor_slices((images, labels)),
      shuffle=is_train if shuffle is None else shuffle,
      repeat=is_train if repeat is None else repeat,
      shuffle_buffer=len(labels), seed=seed)
  dataset = _pipeline.map_with_seeds(
      dataset, _preprocess(hw, preprocessing_factory.get_preprocessing(
          preprocessing_name, is_train)),
      preprocessing_factory.is_random(preprocessing_name, is_train), seed)
  return _pipeline.batch_prefetch(dataset, batch_size, drop_remainder)
