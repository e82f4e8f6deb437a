"""What a model_dir holds, recorded beside its checkpoints: run_config.json.

train.py writes it when it starts (the chief on a cluster): the classifier
(net, classes, schedule, options), image size and preprocessing, data,
towers and the last step. eval.py and export.py read it, so they need only
`--model_dir`; a flag given on their command line overrides the record,
except that the net and the number of classes must match it (the
checkpoints would not load): a mismatch is a `ValueError` saying so.

A resumed train.py refuses another net or other data (`cli.model_dir.
resume`), and names a schedule that changed in its INFO line, e.g. a new
`--max_steps` that moves the decay.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

import classifier
from cli.model_dir import run_settings

FILENAME = "run_config.json"
FORMAT_VERSION = 1
# The rules live in one table (`cli.model_dir.run_settings`), which the tasks
# of an all-reduce job read too.
MUST_MATCH = run_settings.names(on_resume=run_settings.MUST_MATCH,
                                every_script=True)
# Compared on a resume, with the settings of the current optimizer
# (`classifier.OPTIMIZER_SETTINGS`).
SCHEDULE_FIELDS = run_settings.names(schedule=True)


@dataclasses.dataclass(frozen=True)
class RunRecord:
  """A training run's configuration, as recorded in the model_dir."""
  classifier: classifier.ClassifierConfig
  image_size: int
  dataset_name: str
  dataset_dir: Optional[str] = None
  preprocessing: dict = dataclasses.field(default_factory=dict)
  max_steps: Optional[int] = None
  global_batch_size: Optional[int] = None
  towers: tuple = ()
  options: dict = dataclasses.field(default_factory=dict)
  # tf-slim's data flags (train.py); records older than them read as these.
  dataset_split_name: str = "train"
  preprocessing_name: str = "resize"
  labels_offset: int = 0

  def to_json(self) -> str:
    data = dataclasses.asdict(self)
    data["towers"] = list(self.towers)
    return json.dumps({"format_version": FORMAT_VERSION, **data}, indent=2,
                      sort_keys=True) + "\n"

  @classmethod
  def from_dict(cls, data: dict) -> "RunRecord":
    """The record from its JSON dict; unknown keys (newer files) ignored."""
    known = {field.name for field in dataclasses.fields(classifier
                                                        .ClassifierConfig)}
    config = classifier.ClassifierConfig(**{
        key: value for key, value in _upgraded(data["classifier"]).items()
        if key in known})
    fields = {field.name for field in dataclasses.fields(cls)}
    rest = {key: value for key, value in data.items()
            if key in fields and key != "classifier"}
    rest["towers"] = tuple(rest.get("towers", ()))
    return cls(classifier=config, **rest)


def _upgraded(config: dict) -> dict:
  """A classifier record written before `rmsprop_momentum` existed: rmsprop
  then took `momentum`."""
  if config.get("optimizer") == "rmsprop" and "rmsprop_momentum" not in (
      config) and "momentum" in config:
    return {**config, "rmsprop_momentum": config["momentum"]}
  return config


def path(model_dir: str) -> str:
  return os.path.join(model_dir, FILENAME)


def check_folder(model_dir: str) -> None:
  """Refuses a --model_dir that is a file.

  Raises:
    ValueError: naming it and the fix.
  """
  if os.path.exists(model_dir) and not os.path.isdir(model_dir):
    raise ValueError(
        f"--model_dir={model_dir} is a file, not a folder; give the folder "
        "train.py writes its checkpoints to (a new path starts a new run).")


def write(model_dir: str, record: RunRecord) -> str:
  """Writes the record atomically; returns its path."""
  target = path(model_dir)
  temporary = target + ".tmp"
  with open(temporary, "w") as f:
    f.write(record.to_json())
  os.replace(temporary, target)
  return target


def read(model_dir: str) -> Optional[RunRecord]:
  """The recorded configuration, or None when the model_dir has none.

  Raises:
    ValueError: the model dir is a file, or the record exists but cannot be
      read as one.
  """
  check_folder(model_dir)
  try:
    with open(path(model_dir)) as f:
      data = json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as error:
    raise ValueError(f"{path(model_dir)} cannot be read ({error}); fix or "
                     "delete it and give every model flag.") from error
  try:
    return RunRecord.from_dict(data)
  except (KeyError, TypeError, ValueError) as error:
    raise ValueError(f"{path(model_dir)} is not a run configuration "
                     f"({error}); fix or delete it and give every model "
                     "flag.") from error


def check_matches(record: RunRecord, given: dict, model_dir: str) -> None:
  """Raises when a flag given explicitly contradicts the recorded net.

  Args:
    record: the model_dir's record.
    given: flag name -> value, for the flags on the command line.
    model_dir: for the message.

  Raises:
    ValueError: `--model_name` or `--num_classes` differs from the record.
  """
  for name in MUST_MATCH:
    recorded = getattr(record.classifier, name)
    if name in given and given[name] != recorded:
      raise ValueError(
          f"--{name}={given[name]} but --model_dir={model_dir} holds "
          f"checkpoints of {name}={recorded} ({path(model_dir)}); they "
          f"cannot be loaded into another. Drop --{name} to use the "
          "recorded one, or choose another --model_dir.")


def read_and_fill(model_dir: str, given: dict, defaults: dict) -> tuple:
  """(record, values): the model dir's record (None: none) and, for each
  name of `defaults`, the given flag, else the record's, else the default.

  Raises:
    ValueError: the model dir is a file, the record cannot be read, or a
      given flag contradicts the recorded net (`check_matches`).
  """
  record = read(model_dir)
  if record is not None:
    check_matches(record, given, model_dir)
  return record, recorded_or_given(record, given, defaults)


def recorded_or_given(record: Optional[RunRecord], given: dict,
                      defaults: dict) -> dict:
  """For each name of `defaults`: the given flag, else the record's, else
  the flag's default. Record values are looked up in the record, then in
  its classifier config."""
  values = {}
  for name, default in defaults.items():
    if name in given:
      values[name] = given[name]
    elif record is not None and recorded_value(record, name) is not None:
      values[name] = recorded_value(record, name)
    else:
      values[name] = default
  return values


def recorded_value(record: RunRecord, name: str):
  """The record's value of setting `name` (its classifier's, for the
  classifier's fields); None when it has none."""
  if hasattr(record, name) and name != "classifier":
    return getattr(record, name)
  return getattr(record.classifier, name, None)


def changes(record: RunRecord, current, names) -> list:
  """[(name, recorded value, current value)] of the settings `names` where
  `current` (an object with those attributes, e.g. cli/run_setup.ModelSetup)
  differs from the record, in the order of `names`; a dataset dir is the
  same however its path is spelt."""
  found = []
  for name in names:
    recorded, now = recorded_value(record, name), getattr(current, name)
    if name == "dataset_dir" and recorded and now:
      recorded_path, now_path = _normalized(recorded), _normalized(now)
    else:
      recorded_path, now_path = recorded, now
    if recorded_path != now_path:
      found.append((name, recorded, now))
  return found


def _normalized(path: str) -> str:
  return os.path.normpath(os.path.abspath(os.path.expanduser(path)))


def absolute(path: Optional[str]) -> Optional[str]:
  """A local `path` made absolute (None and URLs such as gs://... as
  given)."""
  if not path or "://" in path:
    return path
  return _normalized(path)


def check_recorded_dir(record: Optional[RunRecord], given: dict,
                       model_dir: str) -> None:
  """Raises when the dataset dir a script takes from the record is gone.

  Raises:
    FileNotFoundError: naming the path as recorded, the record and the fix.
  """
  recorded = record.dataset_dir if record is not None else None
  if not recorded or "dataset_dir" in given or "://" in recorded or (
      os.path.isdir(recorded)):
    return
  relative = ("" if os.path.isabs(recorded) else
              f" (relative to this directory, {os.getcwd()})")
  raise FileNotFoundError(
      f"--dataset_dir={recorded}, as recorded in {path(model_dir)} by "
      f"train.py, is not a directory{relative}: the data moved or was "
      "deleted. Move it back, or give --dataset_dir=<where it is now> "
      "(eval.py, export.py; a resume of train.py reads the recorded one).")


def schedule_changes(recorded: classifier.ClassifierConfig,
                     current: classifier.ClassifierConfig) -> list:
  """[(field, recorded value, current value)] of the schedule's fields and
  the current optimizer's settings."""
  names = SCHEDULE_FIELDS + tuple(
      classifier.OPTIMIZER_SETTINGS[current.optimizer])
  return [(name, getattr(recorded, name), getattr(current, name))
          for name in names
          if getattr(recorded, name) != getattr(current, name)]


def schedule_change_message(changes: list, step: int,
                            rates: Optional[tuple] = None) -> str:
  """What a resume with a changed schedule says after "Resuming from ...":
  what changed and how to keep the recorded schedule. `rates`: (recorded,
  current) learning rate at `step`."""
  what = ", ".join(f"{name} {old} -> {new}" for name, old, new in changes)
  moved = (f"; the learning rate at step {step} moves from {rates[0]:.4g} "
           f"to {rates[1]:.4g}" if rates else "")
  keep = " ".join(f"--{name}={old}" for name, old, _ in changes)
  return (f"with another learning-rate schedule than it recorded: {what}"
          f"{moved}. To keep the recorded schedule, pass {keep}.")
