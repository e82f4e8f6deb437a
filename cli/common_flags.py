"""Flags shared by train.py, eval.py and export.py, and the small functions
that read them into plain library arguments (the library itself defines no
flags).

eval.py and export.py take the model and data flags from the model_dir's
recorded configuration (run_config.py) unless given on the command line.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from absl import flags
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu import devices as devices_lib

import datasets
import nets
from cli import data_flags  # --dataset_split_name, --labels_offset.
from cli import run_config
from cli import validators

FLAGS = flags.FLAGS

flags.DEFINE_string("model_name", "lenet", "Network from nets_factory: "
                    + ", ".join(nets.NETWORK_NAMES))
flags.DEFINE_enum("dataset_name", "digits", list(datasets.DATASET_NAMES),
                  "Input data: the built-in digits, synthetic images, or "
                  "tf-slim-style TFRecords in --dataset_dir.")
flags.DEFINE_string("dataset_dir", None, "Directory of TFRecord shards.")
flags.DEFINE_integer("image_size", None, "Image side; default: the net's or "
                     "the dataset's.")
flags.DEFINE_integer("num_classes", None, "Classes; default: the dataset's.")
flags.DEFINE_integer("batch_size", 64, "Global batch size (split across the "
                     "towers).")
flags.DEFINE_string("model_dir", "runs/digits", "Checkpoints and summaries.")
flags.DEFINE_float("moving_average_decay", None, "Keep an exponential moving "
                   "average of the weights with this decay, e.g. 0.999.")
flags.DEFINE_integer("num_gpus", None, "Train on the first N GPUs.")
flags.DEFINE_list("devices", None, "Tower devices, e.g. /gpu:0,/gpu:2.")
flags.DEFINE_list("gpus", None, "Pin the process to these GPUs (nvidia-smi "
                  "ids), e.g. 1,3; they become /gpu:0, /gpu:1. Sets "
                  "CUDA_VISIBLE_DEVICES before TensorFlow starts.")


def _pin_gpus_at_parse(gpus: Optional[list]) -> bool:
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


flags.DEFINE_integer("virtual_cpus", None, "Run N towers on N virtual CPU "
                     "devices (default on machines without GPUs: 2). The "
                     "same name in every tool (python -m "
                     "estimator_multigpu.devices --virtual_cpus=N).")
flags.DEFINE_integer("max_steps", 1500, "train.py: train until this global "
                     "step. eval.py: stop after evaluating a checkpoint at "
                     "or past it (default: the step train.py recorded in "
                     "--model_dir).")
flags.DEFINE_integer("random_seed", 1, "Graph-level random seed.")
flags.register_validator("gpus", _pin_gpus_at_parse)


@dataclasses.dataclass(frozen=True)
class Towers:
  """Where the towers run and the session config that provides it."""
  devices: list
  session_config: tf.compat.v1.ConfigProto


def resolve_towers(num_gpus: Optional[int], devices: Optional[list],
                   virtual_cpus: Optional[int],
                   gpus: Optional[list] = None) -> Towers:
  """--devices, else --num_gpus, else --virtual_cpus, else GPUs or 2 CPUs.

  With `gpus` (--gpus=1,3) the process is first pinned to those GPUs (the
  flag already did so while it was parsed; pinning again is a no-op).
  """
  if gpus is not None:
    devices_lib.pin_gpus(gpus)
  given = [name for name, value in (("--devices", devices),
                                    ("--num_gpus", num_gpus),
                                    ("--virtual_cpus", virtual_cpus))
           if value is not None]
  if len(given) > 1:
    raise ValueError(f"{' and '.join(given)} both choose the towers; give "
                     "only one of --devices, --num_gpus, --virtual_cpus.")
  validators.check_num_gpus(num_gpus, devices_lib.num_visible_gpus())
  if devices is None and num_gpus is None and virtual_cpus is None:
    virtual_cpus = None if devices_lib.num_visible_gpus() else 2
  num_cpus = virtual_cpus or 1
  if virtual_cpus is not None:
    devices = [f"/cpu:{k}" for k in range(virtual_cpus)]
  resolved = devices_lib.resolve_devices(devices if devices is not None
                                         else num_gpus)
  return Towers(resolved, emg.make_session_config(num_cpus=num_cpus))


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
  return data_flags.classes_after_offset(
      datasets.num_classes(dataset_name, dataset_dir), labels_offset,
      dataset_name)


def setup_from_flags() -> tuple:
  """(towers, num_classes, image_size) from the shared flags."""
  flag = FLAGS
  towers = resolve_towers(flag.num_gpus, flag.devices, flag.virtual_cpus,
                          flag.gpus)
  classes = num_classes(flag.dataset_name, flag.dataset_dir, flag.num_classes)
  size = image_size(flag.model_name, flag.dataset_name, flag.image_size)
  return towers, classes, size


# The flags that say which model a model_dir holds and what data it reads.
MODEL_FLAGS = ("model_name", "num_classes", "image_size", "dataset_name",
               "dataset_dir", "labels_offset")


def given_flags(names) -> dict:
  """name -> value of the flags among `names` given on the command line."""
  return {name: FLAGS[name].value for name in names if FLAGS[name].present}


@dataclasses.dataclass(frozen=True)
class ModelSetup:
  """Which model and data a script uses: flags over the model_dir's record.

  `record` is the model_dir's RunRecord (None: it has none).
  """
  model_name: str
  num_classes: int
  image_size: int
  dataset_name: str
  dataset_dir: Optional[str]
  record: Optional[run_config.RunRecord] = None
  labels_offset: int = 0

  def classifier_config(self) -> "classifier.ClassifierConfig":
    """The recorded classifier (its net, classes), else a default one."""
    import classifier  # pylint: disable=g-import-not-at-top
    if self.record is None:
      return classifier.ClassifierConfig(model_name=self.model_name,
                                         num_classes=self.num_classes)
    return dataclasses.replace(self.record.classifier,
                               model_name=self.model_name,
                               num_classes=self.num_classes)


def model_setup(model_dir: str) -> ModelSetup:
  """The model and data flags, with the model_dir's record filling in the
  ones not given on the command line.

  Raises:
    ValueError: `--model_name` or `--num_classes` contradicts the record.
  """
  record = run_config.read(model_dir)
  given = given_flags(MODEL_FLAGS)
  if record is not None:
    run_config.check_matches(record, given, model_dir)
    data_flags.check_labels_offset(record.labels_offset, given, model_dir)
  values = run_config.recorded_or_given(
      record, given, {name: FLAGS[name].value for name in MODEL_FLAGS})
  offset = values["labels_offset"] or 0
  classes = num_classes(values["dataset_name"], values["dataset_dir"],
                        values["num_classes"], offset)
  size = image_size(values["model_name"], values["dataset_name"],
                    values["image_size"])
  return ModelSetup(values["model_name"], classes, size,
                    values["dataset_name"], values["dataset_dir"], record,
                    offset)


def recorded_max_steps(record: Optional[run_config.RunRecord]) -> int:
  """--max_steps when given, else the recorded last step, else the default."""
  if FLAGS["max_steps"].present or record is None or not record.max_steps:
    return FLAGS.max_steps
  return record.max_steps


def towers_from_flags() -> Towers:
  return resolve_towers(FLAGS.num_gpus, FLAGS.devices, FLAGS.virtual_cpus,
                        FLAGS.gpus)
