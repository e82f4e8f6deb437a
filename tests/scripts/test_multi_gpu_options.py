"""train.py's `multi_gpu` options come from one table (issue 45):
cli/multi_gpu_options.py's rows make the flags, the settings group, the
keyword options of `multi_gpu`, the run record and the compared settings."""

import dataclasses

from absl import flags
import pytest

from estimator_multigpu import options as options_lib

from cli import multi_gpu_options
from cli import settings
from cli.flags import definitions as cli_flags
from cli.flags import grouped_help
from cli.model_dir import run_record
from cli.model_dir import run_settings
import train

FLAGS = flags.FLAGS
ROWS = multi_gpu_options.ROWS
OPTIONS = {field.name: field.default
           for field in dataclasses.fields(options_lib.Options)}


def test_every_row_sets_an_options_field_once():
  assert {row.option for row in ROWS} <= set(OPTIONS)
  assert len({row.option for row in ROWS}) == len(ROWS)
  assert [row.name for row in ROWS if row.flag] == ["moving_average_decay"]


@pytest.mark.usefixtures("parsed_flags")
def test_each_row_is_a_train_flag_with_the_options_default():
  own = set(cli_flags.names(*train.FLAG_GROUPS))
  for row in ROWS:
    assert row.name in own
    assert FLAGS[row.name].default == OPTIONS[row.option]
    assert FLAGS[row.name].help.endswith(row.help)


def test_the_settings_group_names_them_as_multi_gpu_does():
  given = settings.MultiGpuSettings(moving_average_decay=0.9,
                                    accumulate_steps=3)
  assert [f.name for f in dataclasses.fields(given)] == [r.name for r in ROWS]
  expected = {row.option: OPTIONS[row.option] for row in ROWS}
  assert given.options() == dict(expected, ema_decay=0.9, accumulate_steps=3)
  options_lib.check_options(**given.options())  # every key an option.


def test_the_run_record_holds_every_option_the_app_sets():
  options = run_record.run_options(settings.TrainSettings(
      multi_gpu=settings.MultiGpuSettings(mixed_precision="bfloat16")))
  assert {row.name for row in ROWS} <= set(options)
  assert options["mixed_precision"] == "bfloat16"


def test_tasks_and_resumes_compare_every_option_the_app_sets():
  compared = {s.name for s in run_settings.SETTINGS
              if s.source == "multi_gpu" and s.across_tasks}
  assert compared == {row.name for row in ROWS}


def test_each_option_flag_has_its_help_group():
  titles = dict(grouped_help.GROUPS)
  for row in ROWS:
    assert row.name in titles[row.group]
