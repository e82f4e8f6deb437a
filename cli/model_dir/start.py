"""The model dir at the start of a training run (a local run, a cluster's
chief): the checkpoint it holds fits the graph the run plans to build
(`restore_check`), something is left to train, and run_config.json records
the run (`run_record`). The other tasks of a cluster write no model dir.
"""

from __future__ import annotations

from typing import Optional

from absl import logging

from estimator_multigpu import cluster

from cli import run_plan
from cli import settings as settings_lib
from cli.model_dir import checkpoints
from cli.model_dir import restore_check
from cli.model_dir import run_record


def nothing_to_train(model_dir: str, max_steps: int) -> bool:
  """Logs and returns True when the model dir is at or past `max_steps`."""
  step = checkpoints.trained_step(model_dir)
  if step is None or step < max_steps:
    return False
  logging.warning(
      "--model_dir=%s is already at step %d, at or past --max_steps=%d: "
      "nothing to train. Give --max_steps above %d to train on, or another "
      "--model_dir to start over.", model_dir, step, max_steps, step)
  return True


def check_and_record(task: Optional[cluster.Task],
                     settings: settings_lib.TrainSettings,
                     planned: run_plan.Plan) -> bool:
  """Readies this task's model dir for the planned run.

  Returns:
    False when a local run has nothing left to train (it logs why).

  Raises:
    ValueError: the model dir's checkpoint does not fit the planned graph.
  """
  if task is not None and not task.is_chief:
    return True
  restore_check.check_estimator(
      planned.restoring, restore_check.input_specs(planned.input_fn),
      planned.setup.num_classes)
  if task is None and nothing_to_train(
      settings.run.model_dir, settings.optimization.max_steps):
    return False
  run_record.record_run(planned.setup, planned.config, planned.towers,
                        settings)
  return True
