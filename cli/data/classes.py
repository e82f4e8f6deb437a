"""The classes a run builds, checked against the data's: `--num_classes`
against the records' labels.txt, `--labels_offset` against the classes and
the model dir's record."""

from __future__ import annotations

import os
from typing import Optional

from datasets import tfrecord


def classes_after_offset(num_classes: int, offset: int,
                         dataset_name: str) -> int:
  """The net's classes: the dataset's minus the offset.

  Raises:
    ValueError: no class would be left.
  """
  if offset and num_classes - offset < 1:
    raise ValueError(
        f"--labels_offset={offset} leaves no class of the {num_classes} of "
        f"dataset {dataset_name}; give an offset below {num_classes}.")
  return num_classes - offset


def listed_classes(dataset_name: str,
                   dataset_dir: Optional[str]) -> Optional[int]:
  """The classes the records' labels.txt lists (None: not records, or no
  labels.txt to read)."""
  if dataset_name != tfrecord.NAME or not dataset_dir or (
      not tfrecord.has_label_file(dataset_dir)):
    return None
  return len(tfrecord.read_label_file(dataset_dir))


def check_num_classes(num_classes: int, dataset_name: str,
                      dataset_dir: Optional[str],
                      labels_offset: int = 0) -> None:
  """Raises when a given `--num_classes` differs from the records' classes
  (labels.txt's lines minus `--labels_offset`).

  Raises:
    ValueError: naming both numbers, the labels file and the fix.
  """
  listed = listed_classes(dataset_name, dataset_dir)
  if listed is None or num_classes == listed - labels_offset:
    return
  expected = listed - labels_offset
  offset = (f", minus --labels_offset={labels_offset} is {expected}"
            if labels_offset else "")
  raise ValueError(
      f"--num_classes={num_classes} but the records in --dataset_dir="
      f"{dataset_dir} have {listed} classes "
      f"({os.path.join(dataset_dir, tfrecord.LABELS_FILENAME)} lists "
      f"{listed}{offset}); drop --num_classes (it is read from that file) "
      f"or give --num_classes={expected}.")


def check_labels_offset(recorded: int, given: dict, model_dir: str) -> None:
  """Raises when --labels_offset contradicts the model_dir's record.

  Raises:
    ValueError: the given offset differs from the recorded one.
  """
  if "labels_offset" in given and given["labels_offset"] != recorded:
    raise ValueError(
        f"--labels_offset={given['labels_offset']} but --model_dir="
        f"{model_dir} was trained with labels_offset={recorded}, so its "
        "classes are other labels; drop --labels_offset to use the recorded "
        "one, or choose another --model_dir.")
