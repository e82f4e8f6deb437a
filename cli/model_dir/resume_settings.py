"""A resumed train.py keeps the settings its model dir recorded.

On a local resume (the model dir holds checkpoints and run_config.json),
every setting of the run-settings table (cli/model_dir/run_settings.py)
not given on the command line takes its recorded value instead of the
flag's default: `python train.py --model_dir=runs/x` after a run with
`--batch_size=128 --learning_rate=0.1 --max_steps=3000` goes on with those.
The towers are the exception (a checkpoint moves across tower counts), and
so is a schedule's length: with `--max_steps`, `--warmup_steps`,
`--decay_steps` or `--num_epochs_per_decay` given, the decay period is
derived anew (in epochs if the run gave it in epochs). The net and data (`MUST_MATCH`) are cli/run_setup.py's.
A given setting that differs from the record is named in the resume's one
line (`changed`, cli/model_dir/run_record.py).
"""

from __future__ import annotations

import dataclasses
from typing import AbstractSet, List, Optional, Tuple

from cli import settings as settings_lib
from cli.model_dir import resume
from cli.model_dir import run_config
from cli.model_dir import run_settings

# Not kept from the record: the same by definition, or kept elsewhere
# (fine-tuning's scopes: cli/fine_tuning.py).
_NOT_KEPT = ("model_dir", "trainable_scopes")
# Given, any of these derives the decay period anew.
_SCHEDULE_LENGTH = ("max_steps", "warmup_steps", "decay_steps",
                    "num_epochs_per_decay")
_MISSING = object()
Change = Tuple[str, object, object]  # (flag name, recorded, current).


def _kept() -> tuple:
  """The table's settings a resume keeps (those that may change)."""
  return tuple(s for s in run_settings.SETTINGS
               if s.on_resume == run_settings.MAY_CHANGE and
               s.name not in _NOT_KEPT)


def recorded(record: run_config.RunRecord, setting: run_settings.Setting):
  """The record's value of a table setting (`_MISSING`: not recorded)."""
  if setting.source == run_settings.CLASSIFIER:
    return getattr(record.classifier, setting.name, _MISSING)
  special = {"batch_size": record.global_batch_size,
             "max_steps": record.max_steps}
  value = special.get(setting.name, record.options.get(setting.name,
                                                        _MISSING))
  return _MISSING if value is None and setting.name in special else value


def _group(settings: settings_lib.TrainSettings, flag: str) -> Optional[str]:
  """The settings group with a field named `flag` (None: none)."""
  for group in dataclasses.fields(settings):
    if flag in {f.name for f in dataclasses.fields(getattr(settings,
                                                           group.name))}:
      return group.name
  return None


def _replace(settings, flag: str, value):
  group = _group(settings, flag)
  if group is None:
    return settings
  value = tuple(value) if isinstance(value, list) else value
  return dataclasses.replace(settings, **{group: dataclasses.replace(
      getattr(settings, group), **{flag: value})})


def keep_recorded(settings: settings_lib.TrainSettings,
                  record: Optional[run_config.RunRecord],
                  given: AbstractSet[str]) -> settings_lib.TrainSettings:
  """`settings` with each setting not `given` (flag names) set to its
  recorded value, on a resume; unchanged when the run is no resume."""
  if not resume.is_resume(settings.run.model_dir, record):
    return settings
  length_given = bool(given & set(_SCHEDULE_LENGTH))
  for setting in _kept():
    value = recorded(record, setting)
    if setting.flag_name[2:] in given or value is _MISSING or (
        setting.name == "decay_steps" and length_given):
      continue
    settings = _replace(settings, setting.flag_name[2:], value)
  if not length_given:  # the recorded decay_steps: no epoch to count.
    return _replace(settings, "num_epochs_per_decay", None)
  if not given & {"decay_steps", "num_epochs_per_decay"}:
    settings = _replace(settings, "num_epochs_per_decay",
                        record.options.get("num_epochs_per_decay"))
  return settings


def current(settings: settings_lib.TrainSettings, config,
            setting: run_settings.Setting):
  """A table setting's value in this run (`config`: its ClassifierConfig)."""
  return getattr(run_settings.source_of(setting, settings, config),
                 setting.name)


def changed(record: run_config.RunRecord,
            settings: settings_lib.TrainSettings, config,
            skip: AbstractSet[str] = frozenset()) -> List[Change]:
  """[(flag name, recorded, current)] of the kept settings this run
  changes (but those named in `skip`), in the table's order."""
  found = []
  for setting in _kept():
    value = recorded(record, setting)
    now = current(settings, config, setting)
    now = list(now) if isinstance(now, tuple) else now
    if value is not _MISSING and value != now and setting.name not in skip:
      found.append((setting.flag_name[2:], value, now))
  return found
