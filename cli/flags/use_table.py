"""No flag is ignored: the table of when each flag is used, checked once.

`USES` says, for every flag that some script, dataset or mode has no use
for, which scripts read it and under which condition. `check` (called by
`cli.flags.definitions.read`, where every script turns its flags into
settings) raises for the first flag given on the command line whose row
says it would be ignored, naming what would use it, e.g.

  --dataset_dir=/tmp/flowers is read only with --dataset_name=tfrecord,
  and this run reads --dataset_name=digits, so the folder would be ignored;
  add --dataset_name=tfrecord, or drop --dataset_dir.

The condition sees the flags' values, with the model dir's record
(run_config.json) standing in for a data flag not given (eval.py and a
resumed train.py read the recorded data). Flags without a row are used
whenever given. Other combinations are checked where they are defined:
tf-slim's optimizer and decay settings (cli/flags/optimization.py), the
restore settings (cli/fine_tuning.py), the checkpoint schedule
(cli/model_dir/checkpoints.py), --sync_replicas (cli/cluster_task.py).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Mapping, Optional, Tuple

from absl import flags

from cli.model_dir import run_config

Values = Mapping[str, object]
TRAIN, EVAL, EXPORT = "train.py", "eval.py", "export.py"
ALL = (TRAIN, EVAL, EXPORT)
RECORDED = ("dataset_name",)  # data a record supplies when not given.


@dataclasses.dataclass(frozen=True)
class Use:
  """When `flag` is used: by `scripts`, when `used(values)` holds.

  `needs` says what uses it and `state` what this run has instead (both
  formatted with the values); `fix` how to make the run use it.
  """
  flag: str
  scripts: Tuple[str, ...] = ALL
  used: Callable[[Values], bool] = lambda values: True
  needs: str = ""
  state: str = ""
  fix: str = ""


def _tfrecord(values: Values) -> bool:
  return values["dataset_name"] == "tfrecord"


def _continuous(values: Values) -> bool:
  return not values.get("once") and not values.get("checkpoint_path")


def _cluster(values: Values) -> bool:
  return bool(values.get("job_name") or values.get("tf_config"))


_DATA = dict(used=_tfrecord, needs="with --dataset_name=tfrecord",
             state="this run reads --dataset_name={dataset_name}",
             fix="add --dataset_name=tfrecord")
_CONTINUOUS = dict(scripts=(EVAL,), used=_continuous,
                   needs="by continuous evaluation (without --once and "
                   "--checkpoint_path)", state="this run evaluates one "
                   "checkpoint", fix="drop --once / --checkpoint_path")
_ON_A_CLUSTER = dict(scripts=(TRAIN,), used=_cluster,
                     needs="on a cluster (--job_name or TF_CONFIG)",
                     state="this is a local run",
                     fix="add the cluster flags (docs/distributed.md)")
_TOWERS = dict(scripts=(TRAIN, EVAL), needs="by train.py and eval.py",
               state="export.py writes a SavedModel without towers that "
               "serves on one CPU")
USES = (
    Use("dataset_dir", **_DATA),
    Use("labels_offset", **{**_DATA, "used": lambda values: (
        _tfrecord(values) or not values["labels_offset"])}),  # 0: no-op.
    Use("batch_size", (TRAIN, EVAL), needs="by train.py and eval.py",
        state="export.py reads no data"),
    Use("dataset_split_name", (TRAIN, EVAL), needs="by train.py and eval.py",
        state="export.py reads no data"),
    *(Use(flag, **_TOWERS) for flag in ("num_gpus", "devices",
                                        "virtual_cpus")),
    Use("gpus", (TRAIN, EVAL), lambda values: not values["virtual_cpus"],
        needs="by GPU towers", state="--virtual_cpus puts the towers on "
        "CPUs", fix="drop --virtual_cpus"),
    Use("moving_average_decay", (TRAIN,), needs="by train.py (it keeps the "
        "averages)", state="{script} uses a checkpoint's averages when it "
        "has them (--nouse_ema_weights: the raw weights)"),
    Use("random_seed", (TRAIN,), needs="by train.py",
        state="{script} draws no random numbers"),
    Use("max_steps", (TRAIN, EVAL), lambda values: (
        values["script"] == TRAIN or _continuous(values)),
        needs="by train.py and continuous evaluation",
        state="{script} does not train or wait for checkpoints"),
    Use("timeout_secs", **_CONTINUOUS),
    Use("task_index", (TRAIN,), lambda values: bool(values.get("job_name")),
        needs="with --job_name", state="this run gives none",
        fix="add --job_name"),
    *(Use(flag, **_ON_A_CLUSTER) for flag in (
        "ps_wait_secs", "ps_linger_secs", "eval_timeout_secs",
        "peer_timeout_secs")),
)


def unused(use: Use, values: Values) -> Optional[str]:
  """Why the flag of `use` would be ignored with `values` (None: used)."""
  script = values["script"]
  if script in use.scripts and use.used(values):
    return None
  fix = f"drop --{use.flag}"
  if use.fix and script in use.scripts:
    fix = f"{use.fix}, or {fix}"
  value = values[use.flag]
  given = f"--{use.flag}" + ("" if isinstance(value, bool) else f"={value}")
  return (f"{given} is used only {use.needs}, and "
          f"{use.state.format(**values)}, so it would be ignored; {fix}.")


def expand_path(value: Optional[str]) -> Optional[str]:
  """A path flag's value with `~` and environment variables expanded."""
  if not value:
    return value
  return os.path.expanduser(os.path.expandvars(value))


def effective_values(flag_values: flags.FlagValues, script: str) -> dict:
  """name -> value of the flags, with recorded data for data not given."""
  values = {name: flag_values[name].value for name in flag_values}
  values.update(script=script, tf_config=os.environ.get("TF_CONFIG"))
  record = _record(values)
  for name in RECORDED:
    if record is not None and not flag_values[name].present:
      values[name] = getattr(record, name)
  return values


def _record(values: Values) -> Optional[run_config.RunRecord]:
  """The record of the model dir the run reads (None: none)."""
  model_dir = expand_path(values.get("model_dir"))
  checkpoint = expand_path(values.get("checkpoint_path"))
  if values["script"] == EVAL and checkpoint:
    model_dir = (checkpoint if os.path.isdir(checkpoint) else
                 os.path.dirname(checkpoint) or model_dir)
  return run_config.read(model_dir) if model_dir else None


def check(flag_values: flags.FlagValues, script: str) -> None:
  """Raises for the first flag given that `script` would ignore.

  Raises:
    ValueError: naming the flag, what would use it and the fix.
  """
  values = effective_values(flag_values, script)
  for use in USES:
    if use.flag in flag_values and flag_values[use.flag].present:
      reason = unused(use, values)
      if reason:
        raise ValueError(reason)
