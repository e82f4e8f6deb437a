"""Several machines on TensorFlow's own distributed runtime (ps/worker).

- `task`: which task this process runs (`Task`, from flags or TF_CONFIG), its
  server and session config (the evaluator's checkpoint loop is
  `estimator_multigpu.runtime.evaluation`).
- `job_control`: how a job starts and ends (waiting for the ps and the chief,
  reporting to the ps, the ps watchdog, `run_trainer`).
- `launch`: `python -m estimator_multigpu.cluster.launch` starts a whole job
  on one machine (loopback), for trying and testing.
- `slurm`: `python -m estimator_multigpu.cluster.slurm` prints the TF_CONFIG
  of a task of a Slurm job (docs/cluster/slurm.sbatch).

The task names are re-exported here: `cluster.Task`, `cluster.PS`, ...
"""

from estimator_multigpu.cluster.task import CHIEF
from estimator_multigpu.cluster.task import EVALUATOR
from estimator_multigpu.cluster.task import PS
from estimator_multigpu.cluster.task import TASK_TYPES
from estimator_multigpu.cluster.task import WORKER
from estimator_multigpu.cluster.task import Task
from estimator_multigpu.cluster.task import check_task
from estimator_multigpu.cluster.task import exit_process
from estimator_multigpu.cluster.task import resolve_task
from estimator_multigpu.cluster.task import server_config
from estimator_multigpu.cluster.task import session_config
from estimator_multigpu.cluster.task import start_server
from estimator_multigpu.cluster.task import task_from_flags
from estimator_multigpu.cluster.task import task_from_tf_config

__all__ = ["CHIEF", "EVALUATOR", "PS", "TASK_TYPES", "WORKER", "Task",
           "check_task", "exit_process", "resolve_task", "server_config",
           "session_config", "start_server", "task_from_flags",
           "task_from_tf_config"]
