"""Several machines on TensorFlow's own distributed runtime.

Shared by both kinds of job:

- `task`: which task this process runs (`Task`, from flags or TF_CONFIG), its
  server and session config (the evaluator's checkpoint loop is
  `estimator_multigpu.runtime.evaluation`).
- `source`: where a task's cluster comes from (TF_CONFIG, the flags, the
  launcher), which its first line and the line of a peer that never came
  name.
- `launch`: `python -m estimator_multigpu.cluster.launch` starts a whole job
  on one machine (loopback), for trying and testing.
- `slurm`: `python -m estimator_multigpu.cluster.slurm` prints the TF_CONFIG
  of a task of a Slurm job (docs/cluster/slurm.sbatch).

One family per kind of job:

- `ps`: parameter-server jobs (ps tasks hold the variables): `ps.job` (how a
  job starts and ends, `run_trainer`), `ps.control_queues` (the small queues
  and probes on the ps), `ps.watchdogs` (a trainer's watch on its ps and its
  chief).
- `all_reduce`: chief and workers, no ps: `all_reduce.training`
  (`train_and_evaluate`), `all_reduce.servers`, `all_reduce.guard`,
  `all_reduce.agreement`, `all_reduce.board`, `all_reduce.board_entries`,
  `all_reduce.board_session`, `all_reduce.strays`, `all_reduce.heartbeat`,
  `all_reduce.peer_probe`, `all_reduce.stop_signal`.
  The graph side of such a job is `cross_tower.across_tasks`: nothing that
  builds the graph imports this package.

The task names are re-exported here: `cluster.Task`, `cluster.PS`, ...
"""

from estimator_multigpu.cluster.task import check_task
from estimator_multigpu.cluster.task import CHIEF
from estimator_multigpu.cluster.task import EVALUATOR
from estimator_multigpu.cluster.task import exit_process
from estimator_multigpu.cluster.task import PS
from estimator_multigpu.cluster.task import resolve_task
from estimator_multigpu.cluster.task import server_config
from estimator_multigpu.cluster.task import session_config
from estimator_multigpu.cluster.task import start_server
from estimator_multigpu.cluster.task import Task
from estimator_multigpu.cluster.task import task_from_flags
from estimator_multigpu.cluster.task import task_from_tf_config
from estimator_multigpu.cluster.task import TASK_TYPES
from estimator_multigpu.cluster.task import WORKER

__all__ = ["CHIEF", "EVALUATOR", "PS", "TASK_TYPES", "WORKER", "Task",
           "check_task", "exit_process", "resolve_task", "server_config",
           "session_config", "start_server", "task_from_flags",
           "task_from_tf_config"]
