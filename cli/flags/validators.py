"""absl validators of the scripts' flags: bad values fail while parsing.

Each check is registered by flag name, for the flags the running script
defines (`register()`, called by each script after its own flags), so a
mistake such as `--batch_size=0`, `--image_size=0`, `--num_classes=0`,
`--decay_steps=0` or `--model_name=resnet` ends before TensorFlow builds
anything, with one line (cli/entry_point.py) naming the flag, the value given,
the values expected and the fix. A flag left at a default of None is not
checked (it means "choose for me").
"""

from __future__ import annotations

import math
from typing import Callable, Optional

from absl import flags

from estimator_multigpu import devices as devices_lib

from datasets import _pipeline
import nets
from preprocessing import preprocessing_factory

FLAGS = flags.FLAGS
Check = Callable[[object], Optional[str]]  # the problem, or None.
OFFSET_DATASETS = ("tfrecord",)  # the others' labels start at class 0.
SPLIT_NAME_EXPECTED = (
    "expected a split name of letters, digits and underscores (e.g. train, "
    "eval, validation): TFRecord files are named "
    "<split>-NNNNN-of-NNNNN.tfrecord; give such a name.")
LABELS_OFFSET_EXPECTED = ("expected an offset >= 0 (e.g. 1 for ImageNet's "
                          "background class); give 0 or more.")


def at_least(low: float, example: str = "") -> Check:
  """Values >= `low` (and finite)."""
  def check(value):
    if not math.isfinite(value) or value < low:
      return f"expected a number >= {low:g}{example}"
    return None
  return check


def above(low: float, example: str = "") -> Check:
  """Finite values > `low`."""
  def check(value):
    if not math.isfinite(value) or value <= low:
      return f"expected a finite number > {low:g}{example}"
    return None
  return check


def in_range(low: float, high: float, closed_high: bool = False,
             example: str = "") -> Check:
  """Values in (low, high) or (low, high]."""
  def check(value):
    inside = low < value <= high if closed_high else low < value < high
    if not (math.isfinite(value) and inside):
      bracket = "]" if closed_high else ")"
      return f"expected a number in ({low:g}, {high:g}{bracket}{example}"
    return None
  return check


def in_interval(low: float, high: float, example: str = "") -> Check:
  """Values in [low, high)."""
  def check(value):
    if not (math.isfinite(value) and low <= value < high):
      return f"expected a number in [{low:g}, {high:g}){example}"
    return None
  return check


def network_name(value) -> Optional[str]:
  if value not in nets.NETWORK_NAMES:
    return f"expected one of {', '.join(nets.NETWORK_NAMES)}"
  return None


CHECKS = {
    "model_name": network_name,
    "batch_size": at_least(1, ", the global batch, e.g. --batch_size=64"),
    "image_size": at_least(1, " (pixels per side), e.g. --image_size=32; "
                           "leave it out for the net's default"),
    "num_classes": at_least(2, "; leave it out for the dataset's count"),
    "max_steps": at_least(1),
    "num_gpus": at_least(1, "; leave it out to use every GPU"),
    "virtual_cpus": at_least(1),
    "moving_average_decay": in_range(0, 1, example=", e.g. 0.999"),
    "learning_rate": above(0, ", e.g. --learning_rate=0.05"),
    "momentum": in_interval(0, 1, ", e.g. 0.9"),
    "decay_steps": at_least(1, "; leave it out for --max_steps minus "
                            "--warmup_steps"),
    "end_learning_rate": at_least(0),
    "warmup_steps": at_least(0),
    "weight_decay": at_least(0, ", e.g. 1e-4 (0: none)"),
    "label_smoothing": in_interval(0, 1, ", e.g. 0.1 (0: none)"),
    "save_summary_steps": at_least(0, " (0: no summaries)"),
    "log_every_n_steps": at_least(1),
    "clip_gradients_by_norm": above(0, ", e.g. 5.0"),
    "accumulate_steps": at_least(1, " (1: an update per batch)"),
    "min_free_disk_mb": at_least(0),
    "task_index": at_least(0),
    "ps_wait_secs": at_least(1),
    "ps_linger_secs": at_least(0),
    "stop_grace_secs": at_least(0),
    "eval_timeout_secs": at_least(1),
    "timeout_secs": at_least(0),
}
_registered = set()


def problem(name: str, value) -> Optional[str]:
  """What is wrong with `--name=value` (absl prefixes `flag --name=value:
  `), or None when it is fine."""
  if value is None or name not in CHECKS:
    return None
  wrong = CHECKS[name](value)
  return None if wrong is None else f"{wrong}."


def _validator(name: str) -> Callable[[object], bool]:
  def validate(value) -> bool:
    message = problem(name, value)
    if message:
      raise flags.ValidationError(message)
    return True
  return validate


def check_num_gpus(num_gpus: Optional[int], visible: int) -> None:
  """Raises when --num_gpus asks for more GPUs than the process sees.

  Raises:
    ValueError: naming both counts and the fix.
  """
  if num_gpus is None or num_gpus <= visible:
    return
  fix = (f"give --num_gpus={visible} or less" if visible else
         "leave --num_gpus out for 2 virtual CPU towers (--virtual_cpus=N "
         "for N)")
  raise ValueError(f"--num_gpus={num_gpus} but this machine shows {visible} "
                   "GPU(s) (CUDA_VISIBLE_DEVICES and --gpus limit them); "
                   f"{fix}.")


def tfrecord_needs_dataset_dir(values: dict) -> bool:
  """--dataset_name=tfrecord without --dataset_dir (train.py)."""
  if values["dataset_name"] == "tfrecord" and not values["dataset_dir"]:
    raise flags.ValidationError(
        "--dataset_name=tfrecord but no --dataset_dir: expected the folder "
        "of <split>-NNNNN-of-NNNNN.tfrecord files and labels.txt; write it "
        "with python convert.py --image_dir=DIR --output_dir=DIR "
        "and pass --dataset_dir=DIR.")
  return True


def digits_classes(values: dict) -> bool:
  """--num_classes other than the digits' 10 with --dataset_name=digits."""
  classes = values["num_classes"]
  if values["dataset_name"] == "digits" and classes not in (None, 10):
    raise flags.ValidationError(
        f"--num_classes={classes} but --dataset_name=digits has 10 classes "
        "(labels 0..9); drop --num_classes.")
  return True


def register(data_flags: bool = False) -> None:
  """Registers the checks of the flags defined so far (once each).

  Args:
    data_flags: also require --dataset_dir with --dataset_name=tfrecord,
      and the digits' own class count (train.py: eval.py and export.py
      read the data flags from the model dir).
  """
  for name in CHECKS:
    if name in FLAGS and name not in _registered:
      flags.register_validator(name, _validator(name))
      _registered.add(name)
  if data_flags and "dataset_dir" not in _registered:
    flags.register_multi_flags_validator(["dataset_name", "dataset_dir"],
                                         tfrecord_needs_dataset_dir)
    flags.register_multi_flags_validator(["dataset_name", "num_classes"],
                                         digits_classes)
    _registered.add("dataset_dir")


def split_name_ok(split: Optional[str]) -> bool:
  """--dataset_split_name: None (the script's default) or a safe name."""
  try:
    return split is None or bool(_pipeline.check_split_name(split))
  except ValueError:
    return False


def labels_offset_ok(offset: Optional[int]) -> bool:
  return offset is None or offset >= 0


def pin_gpus_at_parse(gpus: Optional[list]) -> bool:
  """Pins --gpus while absl parses the flags.

  absl runs its init callbacks after parsing and before `main`, and
  TensorFlow registers one (in `distribute/combinations`) that lists the
  physical devices, which fixes the process's GPUs: later is too late.
  """
  if gpus is None:
    return True
  try:
    devices_lib.pin_gpus(gpus)
  except (TypeError, ValueError, RuntimeError) as error:
    raise flags.ValidationError(str(error)) from error
  return True


def preprocessing_fits_dataset(values: dict) -> bool:
  """--preprocessing_name suits a --dataset_name given with it."""
  if values["preprocessing_name"] and FLAGS["dataset_name"].present:
    try:
      preprocessing_factory.check_for_dataset(values["preprocessing_name"],
                                              values["dataset_name"])
    except ValueError as error:
      raise flags.ValidationError(str(error)) from error
  return True


def offset_fits_dataset(values: dict) -> bool:
  """--labels_offset only with a dataset that has a background class."""
  offset, dataset = values["labels_offset"], values["dataset_name"]
  if offset and FLAGS["dataset_name"].present and (
      dataset not in OFFSET_DATASETS):
    raise flags.ValidationError(
        f"--labels_offset={offset} drops leading classes of stored labels, "
        f"but --dataset_name={dataset} has labels from class 0 and no "
        "background class; use it with --dataset_name=tfrecord, or drop it.")
  return True
