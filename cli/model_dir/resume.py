"""A resumed train.py trains the net it recorded, on the data it recorded.

On a resume (the model dir holds checkpoints and run_config.json) the net
and the data come from the record when not given (cli/run_setup.py). A
setting marked `MUST_MATCH` in the table (cli/model_dir/run_settings.py:
net, classes, dataset, dataset dir, image size) given with another value
is refused before anything is written, naming both values and the fix; so
are images with another number of channels. Schedule settings may change
(cli/model_dir/run_record.py names them).
"""

from __future__ import annotations

from typing import Optional

from estimator_multigpu.runtime import checkpoints as checkpoints_lib

from cli.model_dir import run_config
from cli.model_dir import run_settings
import datasets

SAME_DATA = run_settings.names(on_resume=run_settings.MUST_MATCH)


def is_resume(model_dir: str, record: Optional[run_config.RunRecord]) -> bool:
  """Whether a run in `model_dir` goes on from a recorded run's
  checkpoints (files on disk count, with or without the state file)."""
  return record is not None and bool(
      checkpoints_lib.find_checkpoints(model_dir))


def _other_channels(setup, model_dir: str) -> Optional[str]:
  """The refusal of data with other channels than the recorded model's."""
  recorded = setup.record.preprocessing.get("channels") if setup.record else (
      None)
  current = datasets.preprocessing(setup.dataset_name)["channels"]
  if recorded is None or recorded == current:
    return None
  return (
      f"--dataset_name={setup.dataset_name} gives {current}-channel images "
      f"but --model_dir={model_dir} was trained on {recorded}-channel "
      "images; its first layer cannot take them. Give "
      f"{recorded}-channel data, or train in a new --model_dir.")


def check(model_dir: str, setup) -> None:
  """Refuses a resume whose net or data differ from the record.

  Args:
    model_dir: the run's --model_dir.
    setup: the run's cli/run_setup.ModelSetup (given settings over the
      record).

  Raises:
    ValueError: naming the setting, both values and the fix.
  """
  other_channels = _other_channels(setup, model_dir)
  if not is_resume(model_dir, setup.record):
    return
  found = run_config.changes(setup.record, setup, SAME_DATA)
  if found:
    name, recorded, current = found[0]
    raise ValueError(
        f"--{name}={current} but --model_dir={model_dir} was trained with "
        f"{name}={recorded} ({run_config.path(model_dir)}); a resume goes "
        f"on with the recorded net and data. Drop --{name} to resume with "
        f"{recorded}, or train in a new --model_dir (add --checkpoint_path="
        f"{model_dir} to start from its weights).")
  if other_channels:
    raise ValueError(other_channels)
