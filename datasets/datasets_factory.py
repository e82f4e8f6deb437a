"""One entry point for all datasets: `get_dataset(name, split, ...)`.

Names: ``'digits'`` (scikit-learn's bundled 8x8 digits), ``'synthetic'``
(random images for benchmarks) and ``'tfrecord'`` (sharded records written
by `python convert.py`). Every dataset yields batches of
float32 NHWC images and int32 [batch] labels.
"""

from typing import Callable, Optional

import tensorflow as tf

from datasets import _pipeline
from datasets import digits
from datasets import synthetic
from datasets import tfrecord
from preprocessing import preprocessing_factory

DATASET_NAMES = (digits.NAME, synthetic.NAME, tfrecord.NAME)


def _or(value, default):
  return default if value is None else value


def _check_name(name: str) -> str:
  if name not in DATASET_NAMES:
    raise ValueError(
        f'Unknown dataset name {name!r}; valid names are '
        f'{", ".join(repr(n) for n in DATASET_NAMES)}.')
  return name


def default_image_size(name: str) -> Optional[int]:
  """Native image size of a dataset; None for 'tfrecord' (must be given)."""
  sizes = {digits.NAME: digits.IMAGE_SIZE,
           synthetic.NAME: synthetic.DEFAULT_IMAGE_SIZE, tfrecord.NAME: None}
  return sizes[_check_name(name)]


def preprocessing(name: str) -> dict:
  """How raw pixels become the net's input, for a serving graph to repeat.

  Returns a dict: `channels`, `pixel_scale` (the float image is the raw
  pixel value times it: digits' 0..16 and records' 0..255 become [0, 1]) and
  `resize` (the method that brings images to the image size).
  """
  scale = {digits.NAME: 1.0 / digits.MAX_PIXEL, synthetic.NAME: 1.0,
           tfrecord.NAME: 1.0 / 255.0}[_check_name(name)]
  channels = {digits.NAME: 1, synthetic.NAME: synthetic.DEFAULT_CHANNELS,
              tfrecord.NAME: tfrecord.DEFAULT_CHANNELS}[name]
  return {'channels': channels, 'pixel_scale': scale, 'resize': 'bilinear'}


def num_classes(name: str, data_dir: Optional[str] = None) -> int:
  """Number of classes of a dataset.

  Args:
    name: One of `DATASET_NAMES`.
    data_dir: For 'tfrecord', the folder whose ``labels.txt`` is read.

  Returns:
    10 for digits, 1000 (the default) for synthetic, the number of lines of
    ``labels.txt`` for tfrecord.

  Raises:
    ValueError: for an unknown name, or 'tfrecord' without a labels file.
  """
  if _check_name(name) == digits.NAME:
    return digits.NUM_CLASSES
  if name == synthetic.NAME:
    return synthetic.DEFAULT_NUM_CLASSES
  if not data_dir or not tfrecord.has_label_file(data_dir):
    raise ValueError(
        f"num_classes('tfrecord') reads {tfrecord.LABELS_FILENAME} in "
        f'data_dir, but data_dir={data_dir!r} has none; pass the folder '
        'written by python convert.py, or num_classes itself.')
  return len(tfrecord.read_label_file(data_dir))


def num_examples(name: str, split: str,
                 data_dir: Optional[str] = None) -> int:
  """The number of examples in one epoch of a split.

  Digits know theirs; 'tfrecord' counts the split's records (reading them
  once); synthetic data has no epochs.

  Raises:
    ValueError: for 'synthetic', or an unknown name or split.
  """
  if _check_name(name) == digits.NAME:
    return len(digits.split_indices(split))
  if name == synthetic.NAME:
    raise ValueError(
        f"Dataset {synthetic.NAME!r} is random images without epochs, so an "
        'epoch has no size; give the period in steps (decay_steps, '
        '--decay_steps) instead of in epochs (--num_epochs_per_decay).')
  return tfrecord.count_records(data_dir, split)


def _check_no_labels_offset(name: str, labels_offset: int) -> None:
  if labels_offset:
    raise ValueError(
        f'labels_offset={labels_offset} subtracts from the stored labels, '
        f'but dataset {name!r} has labels from 0 (no background class to '
        "drop); it is for 'tfrecord' data. Leave labels_offset at 0.")


def _check_digits_args(classes: Optional[int], channels: Optional[int],
                       num_examples: Optional[int]) -> None:
  if classes not in (None, digits.NUM_CLASSES):
    raise ValueError(f'digits has {digits.NUM_CLASSES} classes, got '
                     f'num_classes={classes!r}; leave it unset.')
  if channels not in (None, 1):
    raise ValueError(f'digits images have 1 channel, got channels='
                     f'{channels!r}; leave it unset.')
  _check_no_num_examples(digits.NAME, num_examples)


def _check_no_num_examples(name: str, num_examples: Optional[int]) -> None:
  if num_examples is not None:
    raise ValueError(f'num_examples is only for {synthetic.NAME!r}; dataset '
                     f'{name!r} has a fixed size.')


def _tfrecord_classes(data_dir: Optional[str], classes: Optional[int],
                      labels_offset: int = 0) -> Optional[int]:
  """num_classes given, else from labels.txt (minus the offset) if there is
  one."""
  if classes is not None or not data_dir or not tf.io.gfile.isdir(data_dir):
    return classes
  return num_classes(tfrecord.NAME, data_dir) - labels_offset if (
      tfrecord.has_label_file(data_dir)) else None


# pylint: disable=redefined-outer-name
def get_dataset(name: str, split: str, batch_size: int,
                image_size: Optional[_pipeline.ImageSize] = None,
                data_dir: Optional[str] = None,
                num_classes: Optional[int] = None,
                shuffle: Optional[bool] = None,
                repeat: Optional[bool] = None,
                seed: Optional[int] = None, *,
                drop_remainder: Optional[bool] = None,
                channels: Optional[int] = None,
                num_examples: Optional[int] = None,
                is_training: Optional[bool] = None,
                preprocessing_name: str = preprocessing_factory.DEFAULT_NAME,
                labels_offset: int = 0) -> tf.data.Dataset:
  """Builds a dataset of `(images, labels)` batches.

  Args:
    name: One of `DATASET_NAMES`.
    split: ``'train'`` or ``'eval'`` (tfrecord: any plain file-name prefix).
    batch_size: Examples per batch, >= 1.
    image_size: int or (height, width); default `default_image_size(name)`.
      Required for 'tfrecord'.
    data_dir: Folder of the records ('tfrecord' only).
    num_classes: Synthetic: label range (default 1000). Tfrecord: labels are
      checked against it (default: from labels.txt). Digits: must be 10.
    shuffle: Default True for train only (synthetic data is never shuffled).
    repeat: Repeat forever; default True for train only.
    seed: Shuffle seed (synthetic: data seed).
    drop_remainder: Default True for train; always False for other splits, so
      the final partial batch is kept.
    channels: Synthetic: default 3. Tfrecord: decode to 1, 3 (default) or 4.
    num_examples: Synthetic only: examples per epoch.
    is_training: Training input (shuffled, repeated, whole batches,
      augmented); default: split == 'train'.
    preprocessing_name: One of `preprocessing_factory.PREPROCESSING_NAMES`;
      non-default ones for images only ('crop_flip': not for digits).
    labels_offset: 'tfrecord' only: subtracted from the stored labels.

  Returns:
    A `tf.data.Dataset` of float32 [B, H, W, C] images and int32 [B] labels.

  Raises:
    ValueError: for an unknown name or split, or a bad argument.
    FileNotFoundError: if `data_dir` holds no records of the split.
  """
  _check_name(name)
  _pipeline.check_batch_size(batch_size)
  preprocessing_factory.check_for_dataset(preprocessing_name, name)
  if name != tfrecord.NAME:
    _check_no_labels_offset(name, labels_offset)
  if name == digits.NAME:
    _check_digits_args(num_classes, channels, num_examples)
    return digits.digits_dataset(
        split, batch_size, image_size=image_size, shuffle=shuffle,
        repeat=repeat, drop_remainder=drop_remainder, seed=seed,
        is_training=is_training, preprocessing_name=preprocessing_name)
  if name == synthetic.NAME:
    return synthetic.synthetic_dataset(
        split, batch_size,
        image_size=_or(image_size, synthetic.DEFAULT_IMAGE_SIZE),
        channels=_or(channels, synthetic.DEFAULT_CHANNELS),
        num_classes=_or(num_classes, synthetic.DEFAULT_NUM_CLASSES),
        num_examples=num_examples, repeat=repeat,
        drop_remainder=drop_remainder, seed=seed, is_training=is_training)
  return _get_tfrecord(split, batch_size, image_size, data_dir, num_classes,
                       shuffle, repeat, seed, drop_remainder, channels,
                       num_examples, is_training=is_training,
                       preprocessing_name=preprocessing_name,
                       labels_offset=labels_offset)


# pylint: enable=redefined-outer-name


def _get_tfrecord(split, batch_size, image_size, data_dir, classes, shuffle,
                  repeat, seed, drop_remainder, channels, num_examples,
                  **options):
  """The 'tfrecord' branch of `get_dataset` (same arguments; `options`:
  is_training, preprocessing_name, labels_offset)."""
  _check_no_num_examples(tfrecord.NAME, num_examples)
  if image_size is None:
    raise ValueError(
        "Dataset 'tfrecord' needs image_size (an int or (height, width)): "
        'records may hold images of any size and are resized to it.')
  return tfrecord.tfrecord_dataset(
      data_dir, split, batch_size, image_size=image_size,
      channels=_or(channels, tfrecord.DEFAULT_CHANNELS),
      num_classes=_tfrecord_classes(data_dir, classes, options[
          'labels_offset']), shuffle=shuffle, repeat=repeat,
      drop_remainder=drop_remainder, seed=seed, **options)


def make_input_fn(name: str, split: str, batch_size: int,
                  **kwargs) -> Callable[[], tf.data.Dataset]:
  """Returns an Estimator `input_fn` building `get_dataset(...)` when called.

  Arguments are checked now (so mistakes surface before training starts)
  and the dataset is built later, inside the Estimator's graph.
  """
  with tf.Graph().as_default():  # A scratch graph, just to fail fast.
    get_dataset(name, split, batch_size, **kwargs)
  return lambda: get_dataset(name, split, batch_size, **kwargs)
