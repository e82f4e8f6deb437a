"""What a run uses, resolved from its settings (cli/settings.py): the
towers, the model and data (settings given on the command line over the
model_dir's record, run_config.py), and the training input.

eval.py and export.py take the model and data from the model_dir's record
unless given; train.py's resume does too. `--dataset_split_name` defaults
per script (train.py: 'train', or the recorded split on a resume; eval.py:
'eval'); `--labels_offset` is subtracted from the stored labels (1 drops
ImageNet's background class 0), so the net has the dataset's classes minus
it. The checks of that data against the flags and the model are the data
room's (cli/data/).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from absl import logging
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu import devices as devices_lib

import datasets
from cli import settings as settings_lib
from cli.data import checks
from cli.flags import validators
from cli.model_dir import run_config
from preprocessing import preprocessing_factory

TRAIN_SPLIT = "train"
EVAL_SPLIT = "eval"
# The settings that say which model a model_dir holds and what data it reads.
MODEL_FIELDS = ("model_name", "num_classes", "image_size")
DATA_FIELDS = ("dataset_name", "dataset_dir", "labels_offset")


@dataclasses.dataclass(frozen=True)
class Towers:
  """Where the towers run and the session config that provides it."""
  devices: list
  session_config: tf.compat.v1.ConfigProto


def resolve_towers(num_gpus: Optional[int], devices: Optional[Sequence[str]],
                   virtual_cpus: Optional[int],
                   gpus: Optional[Sequence[str]] = None) -> Towers:
  """--devices, else --num_gpus, else --virtual_cpus, else GPUs or 2 CPUs.

  With `gpus` (--gpus=1,3) the process is first pinned to those GPUs (the
  flag already did so while it was parsed; pinning again is a no-op).

  Raises:
    ValueError: more than one way to choose the towers, or more GPUs than
      the process sees.
  """
  if gpus is not None:
    devices_lib.pin_gpus(list(gpus))
  _check_one_choice(num_gpus, devices, virtual_cpus)
  validators.check_num_gpus(num_gpus, devices_lib.num_visible_gpus())
  if devices is None and num_gpus is None and virtual_cpus is None:
    virtual_cpus = None if devices_lib.num_visible_gpus() else 2
  if virtual_cpus is not None:
    devices = [f"/cpu:{k}" for k in range(virtual_cpus)]
  resolved = devices_lib.resolve_devices(
      list(devices) if devices is not None else num_gpus)
  return Towers(resolved, emg.make_session_config(num_cpus=virtual_cpus or 1))


def _check_one_choice(num_gpus, devices, virtual_cpus) -> None:
  given = [name for name, value in (("--devices", devices),
                                    ("--num_gpus", num_gpus),
                                    ("--virtual_cpus", virtual_cpus))
           if value is not None]
  if len(given) > 1:
    raise ValueError(f"{' and '.join(given)} both choose the towers; give "
                     "only one of --devices, --num_gpus, --virtual_cpus.")


def towers(settings: settings_lib.TowerSettings) -> Towers:
  """`resolve_towers` of the tower settings."""
  return resolve_towers(settings.num_gpus, settings.devices,
                        settings.virtual_cpus, settings.gpus)


@dataclasses.dataclass(frozen=True)
class ModelSetup:
  """Which model and data a script uses: settings over the model_dir's
  record. `record` is the model_dir's RunRecord (None: it has none)."""
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


def _model_and_data(model: settings_lib.ModelSettings,
                    data: settings_lib.DataSettings) -> tuple:
  """(given, all): name -> value of the model and data settings."""
  values = {**{name: getattr(model, name) for name in MODEL_FIELDS},
            **{name: getattr(data, name) for name in DATA_FIELDS}}
  typed = model.given | data.given
  return {name: value for name, value in values.items() if name in typed}, (
      values)


def model_setup(model_dir: str, model: settings_lib.ModelSettings,
                data: settings_lib.DataSettings) -> ModelSetup:
  """The model and data settings, with the model_dir's record filling in
  the ones not given on the command line.

  Raises:
    ValueError: `--model_name`, `--num_classes` or `--labels_offset`
      contradicts the record, `--num_classes` the records' labels.txt, or
      the data's channels the recorded model's (cli/data/).
  """
  given, defaults = _model_and_data(model, data)
  record, values = run_config.resolve(model_dir, given, defaults)
  count, size = checks.resolve(values, given, record, model_dir)
  return ModelSetup(values["model_name"], count, size,
                    values["dataset_name"], values["dataset_dir"], record,
                    values["labels_offset"] or 0)


def recorded_max_steps(record: Optional[run_config.RunRecord],
                       max_steps: int, given: bool) -> int:
  """`max_steps` when `given`, else the recorded last step, else it."""
  if given or record is None or not record.max_steps:
    return max_steps
  return record.max_steps


def split_name(data: settings_lib.DataSettings, default: str) -> str:
  """--dataset_split_name, else the script's `default`."""
  return data.dataset_split_name or default


def train_data(data: settings_lib.DataSettings,
               setup: Optional[ModelSetup] = None) -> dict:
  """The training input's split, preprocessing_name and labels_offset:
  the settings given, else the model_dir's record, else the defaults.

  Raises:
    ValueError: the preprocessing does not suit the dataset.
  """
  names = ("dataset_split_name", "preprocessing_name")
  values = run_config.recorded_or_given(
      setup.record if setup else None,
      {name: getattr(data, name) for name in names if name in data.given},
      {"dataset_split_name": TRAIN_SPLIT,
       "preprocessing_name": preprocessing_factory.DEFAULT_NAME})
  preprocessing_factory.check_for_dataset(
      values["preprocessing_name"],
      setup.dataset_name if setup else data.dataset_name)
  return {"split": values["dataset_split_name"],
          "preprocessing_name": values["preprocessing_name"],
          "labels_offset": setup.labels_offset if setup else 0}


def epoch_size(data: settings_lib.DataSettings,
               setup: Optional[ModelSetup] = None) -> int:
  """Examples in one epoch of the training split (tfrecord: counted)."""
  name = setup.dataset_name if setup else data.dataset_name
  directory = setup.dataset_dir if setup else data.dataset_dir
  split = train_data(data, setup)["split"]
  size = datasets.num_examples(name, split, directory)
  logging.info("An epoch of split %r of %s holds %d examples.", split, name,
               size)
  return size
