"""Picks a preprocessing function by name, like tf-slim's factory.

Names (`--preprocessing_name`):

* ``'resize'`` (default): resize to the image size, nothing random.
* ``'crop'``: random crop of the zero-padded image (`crop_flip`), no flip:
  for images whose mirror image means something else (digits, text).
* ``'crop_flip'``: random crop and left-right flip, tf-slim's standard
  training augmentation. Refused for the digits: a mirrored 2 is no 2.

Every name evaluates with the plain resize (`crop_flip.preprocess_for_eval`),
which the serving graph of export.py repeats.
"""

import functools
from typing import Callable

from preprocessing import crop_flip

DEFAULT_NAME = 'resize'
PREPROCESSING_NAMES = (DEFAULT_NAME, 'crop', 'crop_flip')
# Datasets whose images must not be mirrored.
NO_FLIP_DATASETS = ('digits',)
# Datasets of random pixels: augmenting them only costs time.
RANDOM_DATASETS = ('synthetic',)


def _check_name(name: str) -> str:
  if name not in PREPROCESSING_NAMES:
    raise ValueError(
        f'Unknown preprocessing name {name!r}; expected one of '
        f'{", ".join(PREPROCESSING_NAMES)}. tf-slim\'s per-net names '
        "(cifarnet, inception, vgg, ...) are not provided: 'crop_flip' is "
        'their common random crop and flip.')
  return name


def get_preprocessing(name: str, is_training: bool = False) -> Callable:
  """Returns `fn(image, output_height, output_width, seed=None)`.

  Args:
    name: one of `PREPROCESSING_NAMES`.
    is_training: the training variant (random for 'crop' and 'crop_flip');
      evaluation always resizes only.

  Returns:
    The function; it takes a float [H, W, C] image and, when random, an
    int [2] stateless `seed`.

  Raises:
    ValueError: an unknown name.
  """
  if not is_random(name, is_training):
    return crop_flip.preprocess_for_eval
  return functools.partial(crop_flip.preprocess_for_train,
                           flip=name == 'crop_flip')


def is_random(name: str, is_training: bool) -> bool:
  """Whether the function needs a per-image seed."""
  return _check_name(name) != DEFAULT_NAME and is_training


def check_for_dataset(name: str, dataset_name: str) -> str:
  """Returns `name`, or raises when it does not suit the dataset.

  Raises:
    ValueError: an unknown name, flipping the digits, or augmenting the
      synthetic (random) images.
  """
  if _check_name(name) == 'crop_flip' and dataset_name in NO_FLIP_DATASETS:
    raise ValueError(
        f"Preprocessing 'crop_flip' mirrors images left-right, but dataset "
        f'{dataset_name!r} holds digits, which a mirror turns into other '
        "shapes; use 'crop' (random crop, no flip) or 'resize'.")
  if name != DEFAULT_NAME and dataset_name in RANDOM_DATASETS:
    raise ValueError(
        f'Preprocessing {name!r} augments images, but dataset '
        f'{dataset_name!r} is random pixels; use {DEFAULT_NAME!r}.')
  return name
