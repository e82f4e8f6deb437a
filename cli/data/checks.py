"""The data a run reads, checked against its flags and its model, and the
classes and image size the net is built for: `--num_classes` against the
records' labels.txt, `--labels_offset` against the classes and the model
dir's record, `--image_size` against the net, and the data's channels
against the channels the model dir's model was trained on.

`classes_and_image_size` is the one call of cli/run_setup.py: it runs
every check in the order a mistake is named and returns the resolved
values.
"""

from __future__ import annotations

import os
from typing import Optional

import tensorflow as tf

from cli.model_dir import run_config
import datasets
from datasets import tfrecord
import nets
from nets import strides


def classes_and_image_size(values: dict, given: dict,
            record: Optional[run_config.RunRecord],
            model_dir: str) -> tuple:
  """(num_classes, image_size) of the model and data `values` (the given
  settings over the record's), after the data room's checks.

  Args:
    values: model_name, num_classes, image_size, dataset_name, dataset_dir,
      labels_offset: given, else recorded, else the flags' defaults.
    given: the ones given on the command line.
    record: the model dir's record (None: it has none).
    model_dir: for the messages.

  Raises:
    ValueError: `--labels_offset` contradicts the record, `--num_classes`
      the records' labels.txt, the data's channels the recorded model's, the
      data has one class, or the net cannot take the image size.
    FileNotFoundError: the recorded dataset dir is gone.
  """
  name, directory = values["dataset_name"], values["dataset_dir"]
  offset = values["labels_offset"] or 0
  run_config.check_recorded_dir(record, given, model_dir)
  if record is not None:
    check_labels_offset(record.labels_offset, given, model_dir)
  if "num_classes" in given:
    check_num_classes(given["num_classes"], name, directory, offset)
  check_channels(name, record, model_dir)
  count = num_classes(name, directory, values["num_classes"], offset)
  check_two_classes(count, name, directory, offset)
  size = image_size(values["model_name"], name, values["image_size"])
  check_image_size(values["model_name"], size, name)
  return count, size


def image_size(model_name: str, dataset_name: str,
               flag_value: Optional[int]) -> int:
  """--image_size, else the dataset's native size, else the net's."""
  if flag_value:
    return flag_value
  native = datasets.default_image_size(dataset_name)
  if native and dataset_name == "digits":
    return native
  return nets.get_network_fn(model_name, 2).default_image_size


def num_classes(dataset_name: str, dataset_dir: Optional[str],
                flag_value: Optional[int], labels_offset: int = 0) -> int:
  """--num_classes, else the dataset's minus --labels_offset."""
  if flag_value:
    return flag_value
  return classes_after_offset(
      datasets.num_classes(dataset_name, dataset_dir), labels_offset,
      dataset_name)


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


def check_two_classes(count: int, dataset_name: str,
                      dataset_dir: Optional[str], labels_offset: int) -> None:
  """Raises when the data has one class (--num_classes=1 is refused while
  the flags are parsed): every label would be right, accuracy 1.0.

  Raises:
    ValueError: naming the class, its labels file and the fix.
  """
  if count >= 2:
    return
  listed = (tfrecord.read_label_file(dataset_dir)
            if listed_classes(dataset_name, dataset_dir) else {})
  names = [listed[label] for label in sorted(listed)][labels_offset:]
  what = f"one class, {names[0]!r}" if names else "one class"
  offset = f" after --labels_offset={labels_offset}" if labels_offset else ""
  raise ValueError(
      f"--dataset_dir={dataset_dir} holds {what} ("
      f"{os.path.join(dataset_dir or '', tfrecord.LABELS_FILENAME)}"
      f"{offset}): a classifier needs two or more, or every prediction is "
      "right (accuracy 1.0) and it learns nothing. Convert a folder with a "
      "subfolder of images per class (python convert.py --image_dir=...).")


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


def channels(dataset_name: str) -> int:
  """The channels of a dataset's images (digits 1, the others 3)."""
  return datasets.preprocessing(dataset_name)["channels"]


def check_channels(dataset_name: str,
                   record: Optional[run_config.RunRecord],
                   model_dir: str) -> None:
  """Raises when the data's channels differ from those the model dir's
  model was trained on (its record; None: nothing to compare).

  Raises:
    ValueError: naming both channel counts, the datasets and the fix.
  """
  trained = (record.preprocessing or {}).get("channels") if record else None
  given = channels(dataset_name)
  if trained is None or trained == given:
    return
  same = [name for name in datasets.DATASET_NAMES
          if channels(name) == trained]
  raise ValueError(
      f"--dataset_name={dataset_name} gives {given}-channel images but "
      f"--model_dir={model_dir} holds a model trained on {trained}-channel "
      f"images (dataset {record.dataset_name}, "
      f"{run_config.path(model_dir)}): its first layer takes {trained} "
      f"channel(s). Use {trained}-channel data "
      f"(--dataset_name={' or '.join(same)}), or choose another "
      "--model_dir.")


def check_image_size(model_name: str, size: int, dataset_name: str) -> None:
  """Raises when the net cannot take `size` x `size` images (a net below
  its default size is built once on a placeholder to find out): a layer
  fails to build, or a strided layer gets a map smaller than its stride
  (`nets.collapsed_stride`: a net of SAME padding builds at any size, but
  its maps shrink to 1x1 and it learns nothing; resnet_v1_50 at 8x8
  diverged).

  Raises:
    ValueError: naming the net, the size, --image_size and the net's
      default size.
  """
  network_fn = nets.get_network_fn(model_name, 2)
  default = network_fn.default_image_size
  if size >= default:
    return
  fix = ("(the images are resized), or a net for small images such as lenet "
         "or cifarnet.")
  with tf.Graph().as_default() as graph:
    images = tf.compat.v1.placeholder(
        tf.float32, [1, size, size, channels(dataset_name)])
    try:
      network_fn(images)
    except ValueError as error:
      reason = str(error).splitlines()[0].split(" for '")[0]
      raise ValueError(
          f"--model_name={model_name} does not fit {size}x{size} images of "
          f"{dataset_name} ({reason}); its default size is {default}: give "
          f"--image_size={default} {fix}") from error
  shrunk = strides.collapsed_stride(graph, images)
  if shrunk is not None:
    raise ValueError(
        f"--model_name={model_name} does not fit {size}x{size} images of "
        f"{dataset_name} (it downsamples them by {shrunk.total}: "
        f"`{shrunk.op_name}` strides by {shrunk.stride} over a "
        f"{shrunk.input_size}x{shrunk.input_size} map); it takes "
        f"{shrunk.total}x{shrunk.total} and larger (default size {default}):"
        f" give --image_size={shrunk.total} or more {fix}")


def split_size(dataset_name: str, split: str, dataset_dir: Optional[str],
               at_most: int) -> Optional[int]:
  """min(examples in the split, `at_most`); None when it has no epochs
  (synthetic) or cannot be read here (the input pipeline names why)."""
  if dataset_name == "synthetic":
    return None
  try:
    if dataset_name == "tfrecord":
      return tfrecord.count_records(dataset_dir, split, at_most)
    return datasets.num_examples(dataset_name, split, dataset_dir)
  except (ValueError, OSError):
    return None


def check_batch_of(batch_size: int, dataset_name: str, split: str,
                   dataset_dir: Optional[str]) -> None:
  """Raises when one global batch is larger than the training split (read
  up to one batch and one): 1,000,000 on the 1,437 digits filled 24 GB.

  Raises:
    ValueError: naming both sizes and the fix.
  """
  size = split_size(dataset_name, split, dataset_dir, batch_size + 1)
  if size and batch_size > size:  # 0: an empty shard the input names.
    raise ValueError(
        f"--batch_size={batch_size} is larger than the {size} examples "
        f"of split {split!r} of {dataset_name}: every batch would repeat the "
        f"split {batch_size / size:.1f} times over (and need that much "
        f"more memory); give --batch_size={size} or less.")
