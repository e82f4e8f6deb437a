"""Where a task's cluster comes from, as its first and last lines say.

A process is a cluster task because something said so: the TF_CONFIG
environment variable (which a shell keeps from an earlier job: then a
plain run waits for peers that never come), train.py's cluster flags, or
the launcher (`python -m estimator_multigpu.cluster.launch`, which marks
every task it starts with `LAUNCHER_VARIABLE`). A task names its source
in its first line, and a task that ends because a peer never came names
it again with how to train on this machine alone instead (`end_hint`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional

TF_CONFIG, FLAGS, LAUNCHER = "TF_CONFIG", "flags", "launcher"
LAUNCHER_VARIABLE = "EMG_LAUNCHED"  # set by the launcher on every task.
_CLUSTER_FLAGS = "--ps_hosts, --worker_hosts, --job_name and --task_index"
_WHAT = {
    TF_CONFIG: "the TF_CONFIG environment variable",
    FLAGS: f"the cluster flags ({_CLUSTER_FLAGS})",
    LAUNCHER: "the launcher (python -m estimator_multigpu.cluster.launch)"}
_ALONE = {
    TF_CONFIG: ("to train on this machine alone instead (a TF_CONFIG left "
                "in the shell by an earlier job?), unset TF_CONFIG"),
    FLAGS: f"to train on this machine alone instead, run without {_CLUSTER_FLAGS}",
    LAUNCHER: ("to train on this machine alone instead, run the script "
               "without the launcher")}


@dataclasses.dataclass(frozen=True)
class Source:
  """Where the cluster came from: `kind` is TF_CONFIG, FLAGS or LAUNCHER."""
  kind: str

  def __str__(self) -> str:
    return _WHAT[self.kind]

  @property
  def alone(self) -> str:
    """How to train on this machine alone instead (lower case)."""
    return _ALONE[self.kind]

  @property
  def end_hint(self) -> str:
    """The sentence that ends a line of a task whose peer never came."""
    return f"This task's cluster is given by {self}; {self.alone}."

  def start_line(self, me: str, cluster: Mapping[str, list]) -> str:
    """The first line of task `me` (as started) of `cluster` (TF_CONFIG's
    job -> addresses)."""
    tasks = [f"{job}:{index} at {address}" for job, hosts in cluster.items()
             for index, address in enumerate(hosts)]
    alone = self.alone[0].upper() + self.alone[1:]
    return (f"This task is {me} of a cluster of {len(tasks)} tasks "
            f"({', '.join(tasks)}), given by {self}; not meant as a cluster "
            f"task? {alone}.")


def detect(by_flags: bool = False,
           environ: Optional[Mapping[str, str]] = None) -> Source:
  """The source of this process's cluster: the launcher if it started the
  process, else the flags if `by_flags`, else TF_CONFIG."""
  environ = os.environ if environ is None else environ
  if environ.get(LAUNCHER_VARIABLE):
    return Source(LAUNCHER)
  return Source(FLAGS if by_flags else TF_CONFIG)
