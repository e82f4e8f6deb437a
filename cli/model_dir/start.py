"""The model dir at the start of a training run (a local run, a cluster's
chief): the checkpoint it holds fits the graph the run plans to build
(`restore_check`), something is left to train, and run_config.json records
the run (`run_record`). The other tasks of a cluster write no model dir.
"""

from __future__ import annotations

from typing import Optional

from estimator_multigpu import cluster

from cli import run_plan
from cli import settings as settings_lib
from cli.model_dir import restore_check
from cli.model_dir import run_record
from cli.model_dir import train_checks


def start(task: Optional[cluster.Task], settings: settings_lib.TrainSettings,
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
  if task is None and train_checks.nothing_to_train(
      settings.run.model_dir, settings.optimization.max_steps):
    return False
  run_record.record_run(planned.setup, planned.config, planned.towers,
                        settings)
  return True
