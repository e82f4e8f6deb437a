"""Every flag of train.py, eval.py and export.py, by group, and `read`.

A script calls `define` with the groups it has (each flag is defined once
per process, however many scripts a test imports), then in `main` builds
its settings once with `read(settings.TrainSettings)` (or Eval..., Export...)
and passes them down: `main` and `read` are the only readers of FLAGS.
Defaults come from the settings dataclasses (cli/settings.py). train.py's
own groups (`training`, `fine_tuning`, `cluster`) are
cli/flags/training_flags.py's. `--help` groups the flags by purpose
(cli/flags/grouped_help.py), not by these functions. The library defines
no flags.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Callable, Type, TypeVar

from absl import flags

from cli import settings
from cli.flags import training_flags
from cli.flags import use_table
from cli.flags import validators
import datasets
import nets

# train.py's own groups (cli/flags/training_flags.py).
training = training_flags.training
fine_tuning = training_flags.fine_tuning
cluster = training_flags.cluster

FLAGS = flags.FLAGS
T = TypeVar("T")
_DEFINED = {}  # group function -> the names of the flags it defined.
PATH_FLAGS = ("model_dir", "dataset_dir", "checkpoint_path", "export_dir")


def define(*groups: Callable[[], None], data_checks: bool = False) -> None:
  """Defines the flags of `groups` (once each), then their range checks.

  Args:
    groups: functions of this module, e.g. `shared`, `training`.
    data_checks: also check --dataset_dir and --num_classes against
      --dataset_name (train.py; eval.py and export.py read the model_dir).
  """
  for group in groups:
    if group not in _DEFINED:
      before = set(FLAGS)
      group()
      _DEFINED[group] = set(FLAGS) - before
  validators.register(data_flags=data_checks)


def names(*groups: Callable[[], None]) -> list:
  """The flags `groups` defined (after `define`), sorted: a script's own
  flags, whatever else the process defined."""
  return sorted(set().union(*(_DEFINED[group] for group in groups)))


def read(cls: Type[T], flag_values: flags.FlagValues = FLAGS) -> T:
  """A settings dataclass from the flags named like its fields.

  A field that is itself a settings dataclass is read the same way; a
  field without a flag in this script keeps its default; `given` is the
  set of the fields' flags typed on the command line. A script's settings
  (`cls.SCRIPT`) are first checked for flags it would ignore
  (cli/flags/use_table.py).

  Raises:
    ValueError: a flag given that the script, data or mode does not use.
  """
  if hasattr(cls, "SCRIPT"):
    use_table.check(flag_values, cls.SCRIPT)
  hints = typing.get_type_hints(cls)
  values = {}
  for field in dataclasses.fields(cls):
    if dataclasses.is_dataclass(hints[field.name]):
      values[field.name] = read(hints[field.name], flag_values)
    elif field.name in flag_values:
      values[field.name] = _plain(field.name,
                                  flag_values[field.name].value)
  if "given" in hints:
    values["given"] = frozenset(name for name in values
                                if name in flag_values and
                                flag_values[name].present)
  return cls(**values)


def _plain(name: str, value):
  """A list flag's value as a tuple (settings are frozen); a path flag's
  with `~` and environment variables expanded."""
  if name in PATH_FLAGS:
    return use_table.expand_path(value)
  return tuple(value) if isinstance(value, list) else value


def shared() -> None:
  """The model, data, towers and checkpoint flags of all three scripts."""
  model = settings.defaults(settings.ModelSettings)
  data = settings.defaults(settings.DataSettings)
  flags.DEFINE_string("model_name", model["model_name"], "Network from "
                      "nets_factory: " + ", ".join(nets.NETWORK_NAMES))
  flags.DEFINE_integer("num_classes", None, "Classes; default: the "
                       "dataset's.")
  flags.DEFINE_integer("image_size", None, "Image side; default: the net's "
                       "or the dataset's.")
  flags.DEFINE_enum("dataset_name", data["dataset_name"],
                    list(datasets.DATASET_NAMES), "Input data: the built-in "
                    "digits, synthetic images, or tf-slim-style TFRecords in "
                    "--dataset_dir.")
  flags.DEFINE_string("dataset_dir", None, "Directory of TFRecord shards.")
  flags.DEFINE_integer("batch_size", data["batch_size"], "Global batch size "
                       "(split across the towers).")
  _split_and_offset()
  _towers()
  _run()


def _split_and_offset() -> None:
  """tf-slim's --dataset_split_name and --labels_offset."""
  flags.DEFINE_string("dataset_split_name", None, "The split to read "
                      "(tf-slim's name): train.py trains on it (default: "
                      "train; on a resume the recorded one), eval.py "
                      "evaluates it (default: eval). TFRecords: the "
                      "file-name prefix, e.g. validation; digits: train or "
                      "eval.")
  flags.DEFINE_integer("labels_offset", None, "Subtracted from the dataset's "
                       "labels (tf-slim's; 1 drops ImageNet's background "
                       "class 0): the net gets the dataset's classes minus "
                       "it. TFRecords only (default: the model_dir's "
                       "recorded one, else 0).")
  flags.register_validator("dataset_split_name", validators.split_name_ok,
                           message=validators.SPLIT_NAME_EXPECTED)
  flags.register_validator("labels_offset", validators.labels_offset_ok,
                           message=validators.LABELS_OFFSET_EXPECTED)


def _towers() -> None:
  """--num_gpus, --devices, --gpus, --virtual_cpus."""
  flags.DEFINE_integer("num_gpus", None, "Train on the first N GPUs.")
  flags.DEFINE_list("devices", None, "Tower devices, e.g. /gpu:0,/gpu:2.")
  flags.DEFINE_list("gpus", None, "Pin the process to these GPUs "
                    "(nvidia-smi ids), e.g. 1,3; they become /gpu:0, "
                    "/gpu:1. Sets CUDA_VISIBLE_DEVICES before TensorFlow "
                    "starts.")
  flags.DEFINE_integer("virtual_cpus", None, "Run N towers on N virtual CPU "
                       "devices (default on machines without GPUs: 2). The "
                       "same name in every tool (python -m "
                       "estimator_multigpu.devices --virtual_cpus=N).")
  flags.register_validator("gpus", validators.pin_gpus_at_parse)


def _run() -> None:
  """--model_dir, --checkpoint_path, --max_steps, --random_seed, EMA."""
  run = settings.defaults(settings.RunSettings)
  flags.DEFINE_string("model_dir", run["model_dir"], "Checkpoints and "
                      "summaries.")
  flags.DEFINE_string(
      "checkpoint_path", None,
      "A checkpoint (e.g. runs/digits/model.ckpt-1500), or a directory whose "
      "latest checkpoint is used. train.py: fine-tune from it (tf-slim's "
      "meaning): initialize the net from it when --model_dir has no "
      "checkpoint yet (a resume ignores it). eval.py: evaluate exactly this "
      "checkpoint, once. export.py: export it (default: the latest in "
      "--model_dir).")
  training_flags.option_flags(every_script=True)  # --moving_average_decay
  flags.DEFINE_integer(
      "max_steps", settings.defaults(settings.OptimizationSettings)[
          "max_steps"], "train.py: train until this global step. eval.py: "
      "stop after evaluating a checkpoint at or past it (default: the step "
      "train.py recorded in --model_dir).")
  flags.DEFINE_integer("random_seed", run["random_seed"], "Graph-level "
                       "random seed.")


def weights() -> None:
  """--use_ema_weights, of the scripts that load weights to use them."""
  flags.DEFINE_bool("use_ema_weights", True, "Use the moving-average weights "
                    "when the checkpoint has them.")


def evaluation() -> None:
  """eval.py's own flags."""
  ev = settings.defaults(settings.EvaluationSettings)
  flags.DEFINE_bool("once", ev["once"], "Evaluate the latest checkpoint and "
                    "exit.")
  flags.DEFINE_integer("timeout_secs", ev["timeout_secs"], "Stop after this "
                       "long without a new checkpoint.")
  flags.DEFINE_integer("max_num_batches", None, "Evaluate at most this many "
                       "batches of --batch_size (default: the whole split).")
  flags.register_validator(
      "max_num_batches", lambda value: value is None or value > 0,
      message="expected a number of batches > 0; omit --max_num_batches to "
      "evaluate the whole split.")
  # The model-dir room (issue 35): a read-only model dir's events.
  flags.DEFINE_string("eval_events_dir", None, "Where to write the "
                      "evaluation's events (TensorBoard) instead of "
                      "<model_dir>/eval (default: there, or a new temporary "
                      "folder when the model dir cannot be written).")


def export() -> None:
  """export.py's own flag."""
  flags.DEFINE_string("export_dir", None, "Where to write the SavedModel (a "
                      "numbered subdirectory is created).")
