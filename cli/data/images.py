"""The images a run reads, checked against its model: `--image_size`
against the net, and the data's channels against the channels the model
dir's model was trained on."""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

import datasets
import nets
from cli.model_dir import run_config


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
  its default size is built once on a placeholder to find out).

  Raises:
    ValueError: naming the net, the size, --image_size and the net's
      default size.
  """
  network_fn = nets.get_network_fn(model_name, 2)
  default = network_fn.default_image_size
  if size >= default:
    return
  with tf.Graph().as_default():
    try:
      network_fn(tf.compat.v1.placeholder(
          tf.float32, [1, size, size, channels(dataset_name)]))
    except ValueError as error:
      reason = str(error).splitlines()[0].split(" for '")[0]
      raise ValueError(
          f"--model_name={model_name} does not fit {size}x{size} images of "
          f"{dataset_name} ({reason}); its default size is {default}: give "
          f"--image_size={default} (the images are resized), or a net for "
          "small images such as lenet or cifarnet.") from error
