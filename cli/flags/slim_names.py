"""tf-slim's flag names and this project's equivalents: one table, as data.

`TABLE` is the table of docs/tf_slim.md ("Coming from tf-slim"), row by
row (tf-slim's cell, this project's cell; markdown), and `markdown_table()`
writes it (a test checks the page holds exactly that). Every `--name` of tf-slim's
cells that no script here defines is refused with its row's equivalent
(`equivalent("train_dir")`: "`--model_dir` (both)"), never with absl's
"Did you mean" of an unrelated flag (`--num_clones` is not
`--num_classes`). `FORMER_NAMES` are this project's renamed flags (a 0.x
package renames without aliases).
"""

from __future__ import annotations

import re
from typing import Dict, Optional, Tuple

TABLE: Tuple[Tuple[str, str], ...] = (
    ("`--train_dir` (train), `--checkpoint_dir` (eval)",
     "`--model_dir` (both)"),
    ("`--eval_dir`", "none: eval.py writes its events to `<model_dir>/eval`"),
    ("`--num_clones`, `--clone_on_cpu`",
     "`--num_gpus` or `--devices`, or `--virtual_cpus=N` for CPU towers"),
    ("`--batch_size` (per clone)",
     "`--batch_size` (global, split across the towers)"),
    ("`--max_number_of_steps`", "`--max_steps`"),
    ("`--train_image_size`, `--eval_image_size`", "`--image_size`"),
    ("`--master`, `--task`, `--worker_replicas`, `--num_ps_tasks`",
     "`--ps_hosts`, `--worker_hosts`, `--job_name`, `--task_index` or "
     "`TF_CONFIG`"),
    ("`--sync_replicas` + `--replicas_to_aggregate`",
     "`--sync_replicas` (one gradient from each worker)"),
    ("`--save_interval_secs`, `--save_summaries_secs`",
     "`--save_checkpoints_secs` (or `_steps`), `--save_summary_steps`"),
    ("`--num_readers`, `--num_preprocessing_threads`",
     "none: tf.data reads and maps in parallel (`AUTOTUNE`)"),
    ("`--quantize`, `--quantize_delay`",
     "none: no quantization-aware training"),
    ("`--use_grayscale`", "none: the net gets the dataset's channels"),
    ("`--optimizer` default `rmsprop`", "default `momentum`"),
    ("`--opt_epsilon` default 1.0",
     "1e-8 for adam and adadelta (TensorFlow's), 1.0 for rmsprop"),
    ("`--learning_rate_decay_type` default `exponential`, staircase",
     "default `cosine`; `--staircase` for slim's steps"),
    ("`--learning_rate_decay_factor` default 0.94", "default 0.5"),
    ("`--num_epochs_per_decay` default 2.0",
     "unset: `--decay_steps`, default `--max_steps` minus warm-up"),
    ("`--preprocessing_name` default: the net's",
     "default `resize` (no augmentation); `crop_flip`"),
)
FORMER_NAMES: Dict[str, str] = {  # renamed flag -> its name now.
    "eval_split": "dataset_split_name",
    "decay_rate": "learning_rate_decay_factor",
}
_FLAG = re.compile(r"`--(\w+)`")


def markdown_table() -> str:
  """The docs' table: a header and one line per row of TABLE."""
  lines = ["| tf-slim | here |", "|---|---|"]
  lines += [f"| {slim} | {here} |" for slim, here in TABLE]
  return "\n".join(lines) + "\n"


def slim_flags() -> Dict[str, str]:
  """tf-slim flag name -> its row's equivalent here (plain text)."""
  return {name: here.replace("`", "") for slim, here in TABLE
          for name in _FLAG.findall(slim)}


def equivalent(name: str, own_flags: frozenset = frozenset()) -> Optional[str]:
  """Why `--name` is not a flag here and what to give instead, when it is
  tf-slim's or a former name; None otherwise (or when it is one of
  `own_flags`, the names this project's scripts define)."""
  if name in FORMER_NAMES:
    return (f"--{name} is the former name of --{FORMER_NAMES[name]}, "
            "renamed without an alias")
  here = slim_flags().get(name)
  if here is None or name in own_flags:
    return None
  return f"--{name} is tf-slim's, here {here}"
