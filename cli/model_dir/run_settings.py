"""One description of a training run's settings, each with its rule.

Two checks read this table: the tasks of an all-reduce job compare the
settings marked `across_tasks` before their first step
(`estimator_multigpu.cluster.agreement`), and a resumed run compares its
settings with the model dir's `run_config.json` (`cli.model_dir.resume`):
those marked `MUST_MATCH` stop it (the net, whose checkpoints would not load
into another, and the data it was trained on), those marked `MAY_CHANGE`
may change (e.g. a larger --max_steps, another learning rate; `schedule`
ones are named in the resume's INFO line). The ones marked `every_script`
stop eval.py and export.py too (`cli.model_dir.run_config.check_matches`);
those may read other data.

Each value is read from the run's resolved classifier configuration
(`classifier.ClassifierConfig`, after a resume read its record), from what
the run trains on (`cli.run_setup.ModelSetup`: the split as resolved, the
script's default or the record's) or from a group of train.py's settings
(`cli.settings.TrainSettings`). Across tasks a value compares as what it
resolves to there: `--variable_update=auto` is `replicated` in an
all-reduce job (the strategy registry's choice), so it agrees with an
explicit `replicated`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from estimator_multigpu.cluster.all_reduce import servers as all_reduce_servers

import classifier
from cli import multi_gpu_options

MUST_MATCH = "must match on resume"
MAY_CHANGE = "may change on resume"
CLASSIFIER = "classifier"  # read from the ClassifierConfig.
SETUP = "setup"  # read from the run's ModelSetup (else its data settings).


@dataclasses.dataclass(frozen=True)
class Setting:
  """A setting: its name, where its value is, and its rules.

  Attributes:
    name: the field's name (in the ClassifierConfig or its settings group).
    source: CLASSIFIER, or the `TrainSettings` group holding it.
    across_tasks: every task of an all-reduce job must have the same value.
    on_resume: MUST_MATCH or MAY_CHANGE.
    every_script: MUST_MATCH in eval.py and export.py too.
    schedule: part of the learning-rate schedule (a resume reports changes).
    flag: the flag that sets it (default: `name`).
    in_job: what a value means in an all-reduce job (default: itself).
  """
  name: str
  source: str
  across_tasks: bool
  on_resume: str = MAY_CHANGE
  every_script: bool = False
  schedule: bool = False
  flag: Optional[str] = None
  in_job: Optional[Callable[[Any], Any]] = None

  @property
  def flag_name(self) -> str:
    return f"--{self.flag or self.name}"


def _optimizer_settings() -> tuple:
  names = sorted({name for settings in classifier.OPTIMIZER_SETTINGS.values()
                  for name in settings})
  return tuple(Setting(name, CLASSIFIER, True) for name in names)


# What an option's value means in an all-reduce job (default: itself).
_IN_JOB = {"variable_update": all_reduce_servers.variable_update_in_job}


def _multi_gpu_settings() -> tuple:
  """train.py's `multi_gpu` options (cli/multi_gpu_options.py): the tasks
  of a job share each; a resume may change it."""
  return tuple(Setting(row.name, "multi_gpu", True,
                       in_job=_IN_JOB.get(row.option))
               for row in multi_gpu_options.ROWS)


SETTINGS = (
    Setting("model_name", CLASSIFIER, True, MUST_MATCH, every_script=True),
    Setting("num_classes", CLASSIFIER, True, MUST_MATCH, every_script=True),
    Setting("weight_decay", CLASSIFIER, True),
    Setting("label_smoothing", CLASSIFIER, True),
    Setting("optimizer", CLASSIFIER, True, schedule=True),
    Setting("learning_rate", CLASSIFIER, True, schedule=True),
    Setting("learning_rate_decay_type", CLASSIFIER, True, schedule=True),
    Setting("decay_steps", CLASSIFIER, True, schedule=True),
    Setting("decay_rate", CLASSIFIER, True, schedule=True,
            flag="learning_rate_decay_factor"),
    Setting("end_learning_rate", CLASSIFIER, True, schedule=True),
    Setting("warmup_steps", CLASSIFIER, True, schedule=True),
    Setting("staircase", CLASSIFIER, True, schedule=True),
    Setting("trainable_scopes", CLASSIFIER, True),
    *_optimizer_settings(),
    Setting("batch_size", "data", True),
    Setting("dataset_name", "data", True, MUST_MATCH),
    Setting("dataset_split_name", SETUP, True),
    Setting("dataset_dir", "data", False, MUST_MATCH),  # paths differ by host.
    Setting("image_size", "model", True, MUST_MATCH),
    *_multi_gpu_settings(),
    Setting("max_steps", "optimization", True),
    Setting("model_dir", "run", True),
    Setting("save_checkpoints_steps", "run", False),
    Setting("random_seed", "run", False),
)
TOWERS = "towers per task"  # compared across tasks too (`across_tasks`).


def names(on_resume: Optional[str] = None, schedule: Optional[bool] = None,
          every_script: Optional[bool] = None) -> tuple:
  """The names of the settings with these rules (None: any), in table
  order."""
  return tuple(s.name for s in SETTINGS
               if on_resume in (None, s.on_resume) and
               schedule in (None, s.schedule) and
               every_script in (None, s.every_script))


def across_tasks(settings, config: classifier.ClassifierConfig,
                 towers_per_task: int, setup=None) -> dict:
  """{flag: value} of every setting the tasks of a job must share, as it
  resolves in the job.

  Args:
    settings: train.py's `TrainSettings`.
    config: the run's resolved ClassifierConfig.
    towers_per_task: this task's towers.
    setup: the run's `ModelSetup` (None: its data settings as given).
  """
  values = {TOWERS: towers_per_task}
  for setting in SETTINGS:
    if setting.across_tasks:
      value = getattr(source_of(setting, settings, config, setup), setting.name)
      values[setting.flag_name] = _plain((setting.in_job or _same)(value))
  return values


def source_of(setting: Setting, settings, config, setup=None):
  """The object holding `setting`'s value in this run."""
  if setting.source == CLASSIFIER:
    return config
  if setting.source == SETUP:
    return setup if setup is not None else settings.data
  return getattr(settings, setting.source)


def _same(value):
  return value


def _plain(value):
  """A JSON value that compares equal after a round trip."""
  return list(value) if isinstance(value, tuple) else value
