"""`--help` for the scripts: every flag of the script, grouped by purpose.

absl's own `--help` lists only the main module's flags, alphabetically, and
`--helpfull` buries the shared ones among absl's and TensorFlow's. The
scripts run through `cli.entry_point.run`, which parses with
`parser(doc)`: `--help` (also `-h`, `-?`, `--helpshort`) prints the first
line of the script's docstring, the flags a newcomer needs ("Start here"),
the rest of the docstring, and every other flag the script and the shared
modules of this checkout define, in the groups below, then exits with
status 0; `--helpfull` is absl's full list.

A flag that no group names is still shown, under "Other", so a new flag is
never hidden.
"""

from __future__ import annotations

import os
import sys
import textwrap
from typing import Callable, Optional, Sequence

from absl import app
from absl import flags

from cli import multi_gpu_options

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))  # the checkout.
HELP_ARGS = ("--help", "-h", "-help", "-?", "--helpshort")
OTHER = "Other"

# Group titles in display order, and the flags each holds. Names not
# defined by a script are skipped; a flag is shown in its first group.
START_HERE = "Start here"
GROUPS = (
    (START_HERE, ("model_dir", "dataset_name", "dataset_dir", "model_name",
                  "batch_size", "max_steps", "learning_rate", "num_gpus",
                  "virtual_cpus", "checkpoint_path")),
    ("Model", ("model_name", "num_classes", "image_size")),
    ("Data", ("dataset_name", "dataset_dir", "batch_size",
              "dataset_split_name", "labels_offset", "preprocessing_name")),
    (multi_gpu_options.TOWERS, (
        "num_gpus", "virtual_cpus", "devices", "gpus",
        *multi_gpu_options.in_group(multi_gpu_options.TOWERS),
        "check_towers")),
    (multi_gpu_options.OPTIMIZATION, (
        "max_steps", "optimizer", "learning_rate", "momentum",
        "adam_beta1", "adam_beta2", "opt_epsilon", "rmsprop_decay",
        "rmsprop_momentum", "adadelta_rho",
        "adagrad_initial_accumulator_value", "ftrl_learning_rate_power",
        "ftrl_initial_accumulator_value", "ftrl_l1", "ftrl_l2",
        "learning_rate_decay_type", "decay_steps", "num_epochs_per_decay",
        "learning_rate_decay_factor", "staircase",
        "end_learning_rate", "warmup_steps", "weight_decay",
        "label_smoothing",
        *multi_gpu_options.in_group(multi_gpu_options.OPTIMIZATION),
        "random_seed")),
    ("Checkpoints", ("model_dir", "checkpoint_path", "save_checkpoints_steps",
                     "save_checkpoints_secs", "stop_grace_secs",
                     "save_summary_steps", "min_free_disk_mb")),
    ("Fine-tuning", ("checkpoint_exclude_scopes", "trainable_scopes",
                     "ignore_missing_vars")),
    ("Evaluation", ("once", "timeout_secs", "use_ema_weights",
                    "max_num_batches", "eval_events_dir")),
    ("Export", ("export_dir",)),
    ("Cluster", ("ps_hosts", "worker_hosts", "job_name", "task_index",
                 "sync_replicas", "ps_wait_secs", "ps_linger_secs",
                 "eval_timeout_secs", "peer_timeout_secs")),
    ("Logging", ("verbosity", "log_every_n_steps", "scaling_report")),
)
ALWAYS_SHOWN = ("verbosity",)  # absl's, but the way to bring the logs back.


def _is_project_module(module_name: str) -> bool:
  """Whether absl's module key names a file of this checkout (not a venv)."""
  if module_name.endswith(".py"):  # the __main__ script: sys.argv[0].
    path = os.path.abspath(module_name)
  else:
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None) or ""
  path = os.path.abspath(path) if path else ""
  return (path.startswith(ROOT + os.sep) and
          "site-packages" not in path and f"{os.sep}.venv" not in path)


def script_flag_names(flag_values: flags.FlagValues = flags.FLAGS,
                      modules: Optional[Sequence[str]] = None,
                      names: Optional[Sequence[str]] = None) -> list:
  """`names`, else the flags `modules` define (default: every module of
  this checkout), plus ALWAYS_SHOWN."""
  if names is not None:
    names = set(names)
  else:
    by_module = flag_values.flags_by_module_dict()
    keys = (modules if modules is not None else
            [key for key in by_module if _is_project_module(key)])
    names = {flag.name for key in keys for flag in by_module.get(key, [])}
  names.update(name for name in ALWAYS_SHOWN if name in flag_values)
  return sorted(names)


def grouped(names: Sequence[str]) -> list:
  """[(title, [names])] in display order; ungrouped names under Other."""
  result, seen = [], set()
  for title, members in GROUPS:
    present = [name for name in members if name in names and name not in seen]
    seen.update(present)
    if present:
      result.append((title, present))
  rest = sorted(set(names) - seen)
  if rest:
    result.append((OTHER, rest))
  return result


def _describe(flag: flags.Flag) -> str:
  name = f"--[no]{flag.name}" if flag.boolean else f"--{flag.name}"
  if flag.short_name:
    name += f", -{flag.short_name}"
  text = flag.help if flag.default is None else (
      f"{flag.help} (default: {flag.default_as_str})")
  body = textwrap.fill(text, width=76, initial_indent="      ",
                       subsequent_indent="      ")
  return f"  {name}\n{body}"


def help_text(doc: str, flag_values: flags.FlagValues = flags.FLAGS,
              modules: Optional[Sequence[str]] = None,
              names: Optional[Sequence[str]] = None) -> str:
  """The docstring's first line, the "Start here" flags, the rest of the
  docstring, then the other flags by group (`names`, else those `modules`
  define; default: every flag this checkout defined)."""
  first, _, rest = doc.strip().partition("\n")
  lines = [first, ""]
  for title, names in grouped(script_flag_names(flag_values, modules,
                                                names)):
    lines.append(f"{title}:")
    lines += [_describe(flag_values[name]) for name in names]
    lines.append("")
    if title == START_HERE and rest.strip():
      lines += [rest.strip(), ""]
  lines.append("TensorFlow's and absl's own flags: --helpfull.")
  return "\n".join(lines) + "\n"


def wants_help(argv: Sequence[str]) -> bool:
  """Whether the command line asks for the short help."""
  args = list(argv[1:])
  if "--" in args:
    args = args[:args.index("--")]
  return any(arg in HELP_ARGS or arg.startswith("--help=") for arg in args)


def parser(doc: str) -> Callable[[list], list]:
  """A `flags_parser` for `app.run`: grouped `--help`, else absl's parse."""

  def parse(argv: list) -> list:
    if wants_help(argv):
      sys.stdout.write(help_text(doc))
      sys.exit(0)
    return app.parse_flags_with_usage(argv)

  return parse
