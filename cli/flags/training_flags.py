"""train.py's own flags, by group: optimization, the `multi_gpu` options,
checkpoints and logs (`training`), fine-tuning, the cluster.

cli/flags/definitions.py defines the flags every script has and reads them
all into settings; the option flags are made from the rows of
cli/multi_gpu_options.py (`option_flags`), their defaults `Options`'.
"""

from __future__ import annotations

from absl import flags

from estimator_multigpu import cluster as cluster_lib

import classifier
from cli import multi_gpu_options
from cli import settings
from cli.flags import optimization
from cli.flags import validators
from preprocessing import preprocessing_factory

_DEFINE = {"float": flags.DEFINE_float, "integer": flags.DEFINE_integer,
           "bool": flags.DEFINE_bool}


def option_flags(every_script: bool) -> None:
  """The flags of `multi_gpu`'s options (cli/multi_gpu_options.py): those
  every script defines, or train.py's own."""
  for row in multi_gpu_options.ROWS:
    if row.every_script != every_script:
      continue
    if row.kind == "enum":
      flags.DEFINE_enum(row.name, row.default, list(row.choices), row.help)
    else:
      _DEFINE[row.kind](row.name, row.default, row.help)


def training() -> None:
  """train.py's optimization, towers, input, checkpoint and log flags."""
  _optimization()
  _optimizer_settings()
  option_flags(every_script=False)
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
  opt = settings.defaults(settings.OptimizationSettings)
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
  slim = settings.defaults(settings.OptimizerSettings)
  for name, text in optimization.SETTING_HELP.items():
    flags.DEFINE_float(name, slim[name], text)
  flags.DEFINE_float("opt_epsilon", None, "adam, rmsprop, adadelta: epsilon "
                     "(default: 1e-8 for adam and adadelta, as TensorFlow; "
                     "1.0 for rmsprop, as tf-slim, whose default is 1.0 for "
                     "all).")
  flags.DEFINE_float("learning_rate_decay_factor", settings.defaults(
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


def _checkpoints() -> None:
  """When train.py saves, and how it logs and stops."""
  run = settings.defaults(settings.RunSettings)
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
  on = settings.defaults(settings.ClusterSettings)
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
