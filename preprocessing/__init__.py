"""Image preprocessing by name, as tf-slim's `preprocessing/` package.

Typical use::

  from preprocessing import preprocessing_factory
  fn = preprocessing_factory.get_preprocessing('crop_flip', is_training=True)
  image = fn(image, 32, 32, seed=seed)  # seed: a [2] stateless seed.

Evaluation always resizes (bilinear), whatever the name: export.py's
serving graph repeats exactly that.
"""

from preprocessing.preprocessing_factory import check_for_dataset
from preprocessing.preprocessing_factory import DEFAULT_NAME
from preprocessing.preprocessing_factory import get_preprocessing
from preprocessing.preprocessing_factory import is_random
from preprocessing.preprocessing_factory import PREPROCESSING_NAMES

__all__ = [
    'DEFAULT_NAME',
    'PREPROCESSING_NAMES',
    'check_for_dataset',
    'get_preprocessing',
    'is_random',
]
