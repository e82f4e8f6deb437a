"""tf-slim's data flags shared by train.py and eval.py, and their checks.

`--dataset_split_name` is tf-slim's name for the split a script reads. One
definition serves both scripts, so its default is None, resolved by each:
train.py trains on 'train' (on a resume: the recorded split), eval.py
evaluates 'eval' (`--eval_split` is kept as its alias in eval.py).
`--labels_offset` is subtracted from the stored labels (1 drops ImageNet's
background class 0 in tf-slim's records); the net then has the dataset's
classes minus the offset. train.py records it, eval.py applies the
recorded one.
"""

from __future__ import annotations

from typing import Optional

from absl import flags

from datasets import _pipeline

FLAGS = flags.FLAGS
TRAIN_SPLIT = "train"
EVAL_SPLIT = "eval"

flags.DEFINE_string("dataset_split_name", None, "The split to read (tf-slim's "
                    "name): train.py trains on it (default: train; on a "
                    "resume the recorded one), eval.py "
                    "evaluates it (default: eval). TFRecords: the file-name "
                    "prefix, e.g. validation; digits: train or eval.")
flags.DEFINE_integer("labels_offset", None, "Subtracted from the dataset's "
                     "labels (tf-slim's; 1 drops ImageNet's background class "
                     "0): the net gets the dataset's classes minus it. "
                     "TFRecords only (default: the model_dir's recorded "
                     "one, else 0).")


def _split_ok(split: Optional[str]) -> bool:
  try:
    return split is None or bool(_pipeline.check_split_name(split))
  except ValueError:
    return False


def _split_named_once(split: Optional[str]) -> bool:
  """eval.py's `--eval_split` alias and `--dataset_split_name` not both."""
  alias = FLAGS["eval_split"].present if "eval_split" in FLAGS else 0
  if alias and FLAGS["dataset_split_name"].present > alias:
    raise flags.ValidationError(
        f"--eval_split is eval.py's earlier name of --dataset_split_name "
        f"(tf-slim's), and both were given (the last one, {split}, would "
        "win); give only --dataset_split_name.")
  return True


flags.register_validator(
    "dataset_split_name", _split_ok,
    message="expected a split name of letters, digits and underscores "
            "(e.g. train, eval, validation): TFRecord files are named "
            "<split>-NNNNN-of-NNNNN.tfrecord; give such a name.")
flags.register_validator("dataset_split_name", _split_named_once)
flags.register_validator(
    "labels_offset", lambda offset: offset is None or offset >= 0,
    message="expected an offset >= 0 (e.g. 1 for ImageNet's background "
            "class); give 0 or more.")


def split_name(default: str) -> str:
  """--dataset_split_name, else the script's `default`."""
  return FLAGS.dataset_split_name or default


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
