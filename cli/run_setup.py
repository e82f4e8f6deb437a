"""The model and data a run uses, resolved from its settings
(cli/settings.py): the settings given on the command line over the
model_dir's record (run_config.py), read once; train.py's also resolve the
training split and preprocessing.

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
from typing import Optional, TYPE_CHECKING

from cli import settings as settings_lib
from cli.data import checks
from cli.model_dir import run_config
from preprocessing import preprocessing_factory

if TYPE_CHECKING:  # classifier imports TensorFlow: loaded where it is used.
  import classifier

TRAIN_SPLIT = "train"
EVAL_SPLIT = "eval"
# The settings that say which model a model_dir holds and what data it reads.
MODEL_FIELDS = ("model_name", "num_classes", "image_size")
DATA_FIELDS = ("dataset_name", "dataset_dir", "labels_offset")
# train.py's data settings, with their defaults when neither given nor
# recorded.
TRAINING_DEFAULTS = {"dataset_split_name": TRAIN_SPLIT,
                     "preprocessing_name": preprocessing_factory.DEFAULT_NAME}


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
  # train.py's (`model_setup(..., training=True)`): what it trains on.
  dataset_split_name: Optional[str] = None
  preprocessing_name: Optional[str] = None

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
                    data: settings_lib.DataSettings, training: bool) -> tuple:
  """(given, all): name -> value of the model and data settings (with
  `training`, train.py's split and preprocessing too)."""
  values = {**{name: getattr(model, name) for name in MODEL_FIELDS},
            **{name: getattr(data, name) for name in DATA_FIELDS},
            **(TRAINING_DEFAULTS if training else {})}
  typed = model.given | data.given
  return {name: getattr(data, name) if name in TRAINING_DEFAULTS else value
          for name, value in values.items() if name in typed}, values


def model_setup(model_dir: str, model: settings_lib.ModelSettings,
                data: settings_lib.DataSettings,
                training: bool = False) -> ModelSetup:
  """The model and data settings, with the model_dir's record filling in
  the ones not given on the command line (with `training`: train.py's
  split and preprocessing too).

  Raises:
    ValueError: `--model_name`, `--num_classes` or `--labels_offset`
      contradicts the record, `--num_classes` the records' labels.txt, the
      data's channels the recorded model's (cli/data/), the preprocessing
      does not suit the dataset, or (training) the batch is larger than
      the split.
  """
  given, defaults = _model_and_data(model, data, training)
  record, values = run_config.read_and_fill(model_dir, given, defaults)
  if training:
    preprocessing_factory.check_for_dataset(values["preprocessing_name"],
                                            values["dataset_name"])
  count, size = checks.classes_and_image_size(values, given, record,
                                              model_dir)
  if training:
    checks.check_batch_of(data.batch_size, values["dataset_name"],
                          values["dataset_split_name"],
                          values["dataset_dir"])
  return ModelSetup(values["model_name"], count, size,
                    values["dataset_name"], values["dataset_dir"], record,
                    values["labels_offset"] or 0,
                    values.get("dataset_split_name"),
                    values.get("preprocessing_name"))


def recorded_max_steps(record: Optional[run_config.RunRecord],
                       max_steps: int, given: bool) -> int:
  """`max_steps` when `given`, else the recorded last step, else it."""
  if given or record is None or not record.max_steps:
    return max_steps
  return record.max_steps


def split_name(data: settings_lib.DataSettings, default: str) -> str:
  """--dataset_split_name, else the script's `default`."""
  return data.dataset_split_name or default
