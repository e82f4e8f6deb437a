"""train.py's input flags from tf-slim: --preprocessing_name, and what the
training input reads (split, preprocessing, labels offset) on a fresh run
or a resume.

`--preprocessing_name` picks the training augmentation (`preprocessing/`);
evaluation and export always resize and scale as before, so eval.py and
export.py have no such flag. On a resume, a flag not given takes the
model_dir's recorded value, as the net and the data do.
"""

from __future__ import annotations

from typing import Optional

from absl import flags
from absl import logging

from cli import common_flags
from cli import data_flags
from cli import run_config
import datasets
from preprocessing import preprocessing_factory

FLAGS = flags.FLAGS
OFFSET_DATASETS = ("tfrecord",)  # the others' labels start at class 0.

flags.DEFINE_enum("preprocessing_name", None,
                  list(preprocessing_factory.PREPROCESSING_NAMES),
                  "Training augmentation: resize (none), crop (random crop "
                  "of the image padded by an eighth of its side), crop_flip "
                  "(crop plus random left-right flip: tf-slim's standard "
                  "augmentation; not for digits, whose mirror images are "
                  "other shapes). Evaluation and export only resize. "
                  "Default: the model_dir's recorded one, else resize.")


def _fits_dataset(values: dict) -> bool:
  if values["preprocessing_name"] and FLAGS["dataset_name"].present:
    try:
      preprocessing_factory.check_for_dataset(values["preprocessing_name"],
                                              values["dataset_name"])
    except ValueError as error:
      raise flags.ValidationError(str(error)) from error
  return True


flags.register_multi_flags_validator(["preprocessing_name", "dataset_name"],
                                     _fits_dataset)


def _offset_fits_dataset(values: dict) -> bool:
  offset, dataset = values["labels_offset"], values["dataset_name"]
  if offset and FLAGS["dataset_name"].present and (
      dataset not in OFFSET_DATASETS):
    raise flags.ValidationError(
        f"--labels_offset={offset} drops leading classes of stored labels, "
        f"but --dataset_name={dataset} has labels from class 0 and no "
        "background class; use it with --dataset_name=tfrecord, or drop it.")
  return True


flags.register_multi_flags_validator(["labels_offset", "dataset_name"],
                                     _offset_fits_dataset)


def train_data(setup: Optional[common_flags.ModelSetup]) -> dict:
  """The training input's split, preprocessing_name and labels_offset:
  the flags given, else the model_dir's record, else the defaults.

  Raises:
    ValueError: the preprocessing does not suit the dataset.
  """
  values = run_config.recorded_or_given(
      setup.record if setup else None,
      common_flags.given_flags(("dataset_split_name", "preprocessing_name")),
      {"dataset_split_name": data_flags.TRAIN_SPLIT,
       "preprocessing_name": preprocessing_factory.DEFAULT_NAME})
  preprocessing_factory.check_for_dataset(
      values["preprocessing_name"],
      setup.dataset_name if setup else FLAGS.dataset_name)
  return {"split": values["dataset_split_name"],
          "preprocessing_name": values["preprocessing_name"],
          "labels_offset": setup.labels_offset if setup else 0}


def epoch_size(setup: Optional[common_flags.ModelSetup]) -> int:
  """Examples in one epoch of the training split (tfrecord: counted)."""
  name = setup.dataset_name if setup else FLAGS.dataset_name
  directory = setup.dataset_dir if setup else FLAGS.dataset_dir
  split = train_data(setup)["split"]
  size = datasets.num_examples(name, split, directory)
  logging.info("An epoch of split %r of %s holds %d examples.", split, name,
               size)
  return size
