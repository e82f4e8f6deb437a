"""Input pipelines (`tf.data`) for the Estimator: digits, synthetic, records.

Typical use::

  import datasets
  input_fn = datasets.make_input_fn('digits', 'train', batch_size=64)
  estimator.train(input_fn, max_steps=1000)

- `datasets_factory`: one entry point, `get_dataset` / `make_input_fn`, over
  `digits` (scikit-learn's 8x8 digits), `synthetic` (random images in the
  graph) and `tfrecord` (sharded records of encoded images, tf-slim style);
  `_pipeline` is their shared checks and shuffle/repeat/batch tail, and
  `record_checks` names the file (and record) of a broken record.
- The converter (`convert_image_folder`, `list_image_folder`; its command
  line is ``python convert.py``), loaded on first use: `convert` writes the
  shards all or nothing, `image_folder` reads the class subfolders,
  `image_formats` and `exif` tell a file's format and orientation,
  `convert_tally` counts what was written and skipped, and `split_record`
  checks a split is whole.
"""

import importlib

from datasets.datasets_factory import DATASET_NAMES
from datasets.datasets_factory import default_image_size
from datasets.datasets_factory import get_dataset
from datasets.datasets_factory import make_input_fn
from datasets.datasets_factory import num_classes
from datasets.datasets_factory import num_examples
from datasets.datasets_factory import preprocessing
from datasets.digits import digits_dataset
from datasets.digits import load_split as load_digits_split
from datasets.synthetic import synthetic_dataset
from datasets.tfrecord import find_shards
from datasets.tfrecord import make_example
from datasets.tfrecord import read_label_file
from datasets.tfrecord import tfrecord_dataset
from datasets.tfrecord import write_label_file

_LAZY = {'convert_image_folder': 'convert', 'list_image_folder': 'image_folder'}

__all__ = [
    'DATASET_NAMES',
    'convert_image_folder',
    'default_image_size',
    'digits_dataset',
    'find_shards',
    'get_dataset',
    'list_image_folder',
    'load_digits_split',
    'make_example',
    'make_input_fn',
    'num_classes',
    'num_examples',
    'preprocessing',
    'read_label_file',
    'synthetic_dataset',
    'tfrecord_dataset',
    'write_label_file',
]


def __getattr__(name: str):
  """Loads the converter's names on first access (PEP 562)."""
  if name not in _LAZY:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  module = importlib.import_module(f'{__name__}.{_LAZY[name]}')
  return getattr(module, name)


def __dir__():
  return sorted(set(globals()) | set(__all__))
