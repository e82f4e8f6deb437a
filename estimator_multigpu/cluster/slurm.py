"""TF_CONFIG for a task of a Slurm job, from the job's nodes and its rank.

In an sbatch script every task that `srun` starts (one per node) runs

    TF_CONFIG="$(python -m estimator_multigpu.cluster.slurm --num_ps=2 \\
        --evaluator)" || exit   # `export X=$(...)` would hide a failure.
    export TF_CONFIG
    exec python train.py <the job's flags>

(docs/cluster/slurm.sbatch). The nodes are `scontrol show hostnames
$SLURM_JOB_NODELIST`, in that order, and rank `SLURM_PROCID` runs on the
node of its number (`--ntasks-per-node=1`). The ranks get their jobs in
order: rank 0 the chief, then the workers, then `--num_ps` ps tasks (0 for
an all-reduce job: chief and workers only) and, with `--evaluator`, the last
rank the evaluator. Each address is
`<node>:<port>`. The TF_CONFIG follows Estimator's convention: the evaluator
is not part of the cluster. A mistake (not inside `srun`, too few nodes,
several tasks per node) exits with status 2 and one line saying the fix.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Mapping, Optional, Sequence

from estimator_multigpu.cluster import task as task_lib

DEFAULT_PORT = 2222
_ENV = ("SLURM_JOB_NODELIST", "SLURM_PROCID", "SLURM_NTASKS")


def hostnames(nodelist: str) -> list:
  """The nodes of a Slurm node list (`node[01-03]`), via `scontrol`.

  Raises:
    ValueError: scontrol is missing or fails.
  """
  try:
    result = subprocess.run(["scontrol", "show", "hostnames", nodelist],
                            capture_output=True, text=True, check=False)
  except FileNotFoundError as error:
    raise ValueError("scontrol is not on PATH: run this inside a Slurm job "
                     "(sbatch, then srun).") from error
  if result.returncode != 0:
    raise ValueError(f"`scontrol show hostnames {nodelist}` failed: "
                     f"{result.stderr.strip()}")
  return result.stdout.split()


def roles(num_nodes: int, num_ps: int, evaluator: bool) -> list:
  """The `(job, index)` of each rank: chief, workers, ps, evaluator.

  Raises:
    ValueError: there are too few nodes for a chief, the ps and evaluator.
  """
  trainers = num_nodes - num_ps - int(evaluator)
  if num_ps < 0 or trainers < 1:
    raise ValueError(
        f"{num_nodes} node(s) for --num_ps={num_ps}"
        f"{' and an evaluator' if evaluator else ''}; expected at least one "
        "ps and one node left for the chief: raise #SBATCH --nodes or lower "
        "--num_ps (--num_ps=0 makes an all-reduce job: no ps).")
  return ([(task_lib.CHIEF, 0)] +
          [(task_lib.WORKER, i) for i in range(trainers - 1)] +
          [(task_lib.PS, i) for i in range(num_ps)] +
          [(task_lib.EVALUATOR, 0)] * int(evaluator))


def slurm_task(hosts: Sequence[str], rank: int, num_ps: int, evaluator: bool,
               port: int = DEFAULT_PORT) -> task_lib.Task:
  """The task of rank `rank` on the nodes `hosts` (one task per node)."""
  ranks = roles(len(hosts), num_ps, evaluator)
  if not 0 <= rank < len(ranks):
    raise ValueError(f"SLURM_PROCID is {rank}; expected 0..{len(ranks) - 1}"
                     f" for {len(hosts)} nodes, one task per node.")
  cluster = {}
  for host, (job, _) in zip(hosts, ranks):
    if job != task_lib.EVALUATOR:
      cluster.setdefault(job, []).append(f"{host}:{port}")
  return task_lib.check_task(task_lib.Task(cluster, *ranks[rank]))


def tf_config(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
  """This Slurm task's TF_CONFIG, from the job's environment."""
  missing = [name for name in _ENV if name not in environ]
  if missing:
    raise ValueError(f"{', '.join(missing)} not set: run this in a task "
                     "that srun starts inside an sbatch job.")
  hosts = hostnames(environ["SLURM_JOB_NODELIST"])
  if int(environ["SLURM_NTASKS"]) != len(hosts):
    raise ValueError(
        f"SLURM_NTASKS is {environ['SLURM_NTASKS']} on {len(hosts)} nodes; "
        "expected one task per node: #SBATCH --ntasks-per-node=1.")
  return slurm_task(hosts, int(environ["SLURM_PROCID"]), args.num_ps,
                    args.evaluator, args.port).tf_config()


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog="python -m estimator_multigpu.cluster.slurm",
      description="Prints the TF_CONFIG of this Slurm task.")
  parser.add_argument("--num_ps", type=int, default=1,
                      help="ps tasks (the ranks after the workers)")
  parser.add_argument("--evaluator", action="store_true",
                      help="the last rank is the evaluator")
  parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                      help="every task's gRPC port")
  return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None,
         environ: Optional[Mapping[str, str]] = None) -> int:
  """Prints TF_CONFIG; a mistake is one line on stderr and status 2."""
  try:
    print(tf_config(parse_args(argv), os.environ if environ is None
                    else environ))
  except ValueError as error:
    print(f"estimator_multigpu.cluster.slurm: {error}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
