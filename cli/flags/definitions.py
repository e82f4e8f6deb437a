"""Every flag of train.py, eval.py and export.py, by group, and `read`.

A script calls `define` with the groups it has (each flag is defined once
per process, however many scripts a test imports), then in `main` builds
its settings once with `read(settings.TrainSettings)` (or Eval..., Export...)
and passes them down: `main` and `read` are the only readers of FLAGS.
Defaults come from the settings dataclasses (cli/settings.py). `--help`
groups the flags by purpose (cli/flags/grouped_help.py), not by these functions.
The library defines no flags.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Callable, Type, TypeVar

from absl import flags

import classifier
import datasets
import nets
from cli.flags import use_table
from cli.flags import optimization
from cli import settings
from cli.flags import validators
from estimator_multigpu import cluster as cluster_lib
import estimator_multigpu as emg
from preprocessing import preprocessing_factory

FLAGS = flags.FLAGS
T = TypeVar("T")
_DEFINED = {}  # group function -> the names of the flags it defined.
PATH_FLAGS = ("model_dir", "dataset_dir", "checkpoint_path", "export_dir")


def _defaults(cls: type) -> dict:
  """name -> default of a settings dataclass's fields."""
  return {field.name: field.default for field in dataclasses.fields(cls)}


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
  model, data = _defaults(settings.ModelSettings), _defaults(
      settings.DataSettings)
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
  run = _defaults(settings.RunSettings)
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
  flags.DEFINE_float("moving_average_decay", None, "Keep an exponential "
                     "moving average of the weights with this decay, e.g. "
                     "0.999.")
  flags.DEFINE_integer("max_steps", _defaults(settings.OptimizationSettings)[
      "max_steps"], "train.py: train until this global step. eval.py: stop "
                       "after evaluating a checkpoint at or past it (default: "
                       "the step train.py recorded in --model_dir).")
  flags.DEFINE_integer("random_seed", run["random_seed"], "Graph-level "
                       "random seed.")


def training() -> None:
  """train.py's optimization, towers, input, checkpoint and log flags."""
  _optimization()
  _optimizer_settings()
  _multi_gpu()
  _checkpoints()
  flags.DEFINE_enum("preprocessing_name", None,
                    list(preprocessing_factory.PREPROCESSING_NAMES),
                    "Training augmentation: resize (none), crop (random crop "
                    "of the image padded by an eighth of its side), "
                    "crop_flip (crop plus random left-right flip: tf-slim's "
                    "standard augmentation; not for digits, whose mirror "
                    "images are other shapes). Evaluation and export only "
                    "resize. Default: the model_dir's recorded one, else "
                    "resize.")
  flags.register_multi_flags_validator(
      ["preprocessing_name", "dataset_name"],
      validators.preprocessing_fits_dataset)
  flags.register_multi_flags_validator(["labels_offset", "dataset_name"],
                                       validators.offset_fits_dataset)
  optimization.register_validators()


def _optimization() -> None:
  """The optimizer, the loss and the learning-rate schedule."""
  opt = _defaults(settings.OptimizationSettings)
  flags.DEFINE_enum("optimizer", opt["optimizer"],
                    list(classifier.OPTIMIZERS), "Optimizer.")
  flags.DEFINE_float("learning_rate", opt["learning_rate"], "Initial "
                     "learning rate.")
  flags.DEFINE_float("momentum", opt["momentum"], "Momentum "
                     "(--optimizer=momentum; rmsprop's is "
                     "--rmsprop_momentum).")
  flags.DEFINE_enum("learning_rate_decay_type",
                    opt["learning_rate_decay_type"],
                    list(classifier.DECAY_TYPES), "Learning-rate schedule.")
  flags.DEFINE_integer("decay_steps", None, "Steps of one decay period "
                       "(default: --max_steps minus warm-up).")
  flags.DEFINE_float("end_learning_rate", opt["end_learning_rate"], "Final "
                     "rate (polynomial, cosine).")
  flags.DEFINE_integer("warmup_steps", opt["warmup_steps"], "Linear warm-up "
                       "steps.")
  flags.DEFINE_float("weight_decay", opt["weight_decay"], "L2 weight decay.")
  flags.DEFINE_float("label_smoothing", opt["label_smoothing"], "Label "
                     "smoothing.")


def _optimizer_settings() -> None:
  """tf-slim's per-optimizer settings and exponential-decay flags."""
  slim = _defaults(settings.OptimizerSettings)
  for name, text in optimization.SETTING_HELP.items():
    flags.DEFINE_float(name, slim[name], text)
  flags.DEFINE_float("opt_epsilon", None, "adam, rmsprop, adadelta: epsilon "
                     "(default: 1e-8 for adam and adadelta, as TensorFlow; "
                     "1.0 for rmsprop, as tf-slim, whose default is 1.0 for "
                     "all).")
  flags.DEFINE_float("learning_rate_decay_factor", _defaults(
      settings.OptimizationSettings)["learning_rate_decay_factor"],
                     "exponential: the learning rate is multiplied by this "
                     "every decay period (tf-slim's default: 0.94).")
  flags.DEFINE_float("num_epochs_per_decay", None, "The decay period in "
                     "epochs of the training split (tf-slim's): decay_steps "
                     "= examples per epoch / examples per step x this. "
                     "Instead of --decay_steps; not for synthetic data.")
  flags.DEFINE_bool("staircase", False, "exponential: lower the rate once "
                    "per whole decay period, as tf-slim does, instead of "
                    "smoothly every step.")


def _multi_gpu() -> None:
  """train.py's options of `emg.multi_gpu`, and its log flags."""
  wrap = _defaults(settings.MultiGpuSettings)
  flags.DEFINE_float("clip_gradients_by_norm", None, "Clip the combined "
                     "gradient to this global norm.")
  flags.DEFINE_enum("variable_update", wrap["variable_update"],
                    list(emg.VARIABLE_UPDATES), "auto: replicated "
                    "with 2+ GPU towers or an all-reduce cluster (no ps), "
                    "shared otherwise; shared: one copy of the variables on "
                    "the aggregation device (tf_cnn_benchmarks "
                    "parameter_server); replicated: a copy per tower and "
                    "all-reduced gradients (tf_cnn_benchmarks replicated).")
  flags.DEFINE_integer("accumulate_steps", wrap["accumulate_steps"], "Apply "
                       "one update per K input batches (gradient "
                       "accumulation); the effective batch is K x "
                       "--batch_size and global_step counts updates.")
  flags.DEFINE_enum("mixed_precision", None, ["bfloat16", "float16"],
                    "Compute in the towers in this precision (float32 master "
                    "weights; float16 with dynamic loss scaling).")
  flags.DEFINE_bool("sync_batch_norm", wrap["sync_batch_norm"], "Batch norm "
                    "over the global batch: the towers all-reduce their "
                    "moments, so N towers train batch-norm nets (resnet_*, "
                    "inception_*) exactly like one device. Eval, predict and "
                    "export are unchanged.")


def _checkpoints() -> None:
  """When train.py saves, and how it logs and stops."""
  run = _defaults(settings.RunSettings)
  flags.DEFINE_integer("save_checkpoints_steps",
                       run["save_checkpoints_steps"], "Checkpoint every N "
                       "steps (> 0; larger than --max_steps: only at the "
                       "start and the end, including a stop by SIGTERM).")
  flags.DEFINE_integer("save_checkpoints_secs", None, "Checkpoint every N "
                       "seconds instead of every --save_checkpoints_steps.")
  flags.DEFINE_integer("save_summary_steps", run["save_summary_steps"],
                       "Summaries every N steps.")
  flags.DEFINE_integer("min_free_disk_mb", run["min_free_disk_mb"], "Refuse "
                       "to start when the model dir's disk has less free "
                       "space than this.")
  flags.DEFINE_integer("stop_grace_secs", run["stop_grace_secs"], "After "
                       "SIGTERM/Ctrl-C, exit without a final checkpoint if "
                       "the current step has not finished within this time "
                       "(e.g. a synchronous step waiting for a dead worker).")
  flags.DEFINE_integer("log_every_n_steps", None, "Progress line every N "
                       "steps or 30 s, whichever comes first (default: a "
                       "tenth of --max_steps, at most 100); the first line "
                       "follows the first step.")
  flags.DEFINE_bool("scaling_report", run["scaling_report"], "Warn when the "
                    "run is input-bound; its per-window report (input wait) "
                    "shows with --verbosity=1.")
  flags.DEFINE_bool("check_towers", run["check_towers"], "Before training, "
                    "train 2 steps on one device and on the towers from the "
                    "same start and stop with one line if they differ "
                    "(estimator_multigpu.check_towers).")


def fine_tuning() -> None:
  """tf-slim's fine-tuning flags (train.py; cli/fine_tuning.py)."""
  flags.DEFINE_list("checkpoint_exclude_scopes", None, "Comma-separated "
                    "scopes of variables not restored from --checkpoint_path "
                    "(a variable is excluded when its name starts with one), "
                    "e.g. the logits: LeNet/fc4.")
  flags.DEFINE_list("trainable_scopes", None, "Comma-separated scopes: only "
                    "variables whose name matches one train, the others stay "
                    "frozen (default: all train), e.g. LeNet/fc4. A resume "
                    "keeps the recorded scopes; --trainable_scopes= trains "
                    "all.")
  flags.DEFINE_bool("ignore_missing_vars", False, "Variables "
                    "--checkpoint_path lacks keep their initial values "
                    "(listed in the log) instead of being an error.")


def cluster() -> None:
  """train.py on a cluster (docs/distributed.md)."""
  on = _defaults(settings.ClusterSettings)
  flags.DEFINE_list("ps_hosts", None, "Cluster: ps addresses, "
                    "host:port,...")
  flags.DEFINE_list("worker_hosts", None, "Cluster: worker addresses, "
                    "host:port,... (the first is the chief).")
  flags.DEFINE_enum("job_name", None, [cluster_lib.PS, cluster_lib.WORKER,
                                       cluster_lib.EVALUATOR],
                    "Cluster: this task's job.")
  flags.DEFINE_integer("task_index", on["task_index"], "Cluster: this task's "
                       "index in its job (worker 0 is the chief).")
  flags.DEFINE_bool("sync_replicas", on["sync_replicas"], "Cluster: average "
                    "one gradient from each worker per step "
                    "(SyncReplicasOptimizer); default asynchronous updates.")
  flags.DEFINE_integer("ps_wait_secs", on["ps_wait_secs"], "Cluster: a "
                       "worker fails if a ps task does not answer within this "
                       "time, at the start or while training.")
  flags.DEFINE_integer("ps_linger_secs", on["ps_linger_secs"], "Cluster: a "
                       "ps exits this long after the chief finished even if "
                       "a worker never reported.")
  flags.DEFINE_integer("eval_timeout_secs", on["eval_timeout_secs"],
                       "Cluster: the evaluator stops after this long without "
                       "a new checkpoint.")
  flags.DEFINE_integer("peer_timeout_secs", on["peer_timeout_secs"],
                       "All-reduce cluster (no ps): a task ends, with one "
                       "line, when another has not answered for this long.")


def weights() -> None:
  """--use_ema_weights, of the scripts that load weights to use them."""
  flags.DEFINE_bool("use_ema_weights", True, "Use the moving-average weights "
                    "when the checkpoint has them.")


def evaluation() -> None:
  """eval.py's own flags."""
  ev = _defaults(settings.EvaluationSettings)
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
