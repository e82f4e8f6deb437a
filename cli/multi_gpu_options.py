"""train.py's options of `emg.multi_gpu`: one row each, the one mapping
from flags to its keyword options (the library's `Options` fields).

A row names the option its flag sets (the flag has the option's name, but
for tf-slim's `--moving_average_decay`, which is `ema_decay`), the flag's
kind, help and `--help` group. Everything else is made from the rows: the
flags (cli/flags/training_flags.py) with the defaults of `multi_gpu`'s
signature (which are `Options`'), their `--help` groups
(cli/flags/grouped_help.py), the settings group `MultiGpuSettings` (one
field per flag), the keyword options train.py gives `multi_gpu` and
`check_towers` (`MultiGpuSettings.options()`), the options the run record
writes and those the tasks of a job and a resume compare
(cli/model_dir/run_record.py, run_settings.py). A new option of train.py
is a new row (its range check at parse time, if any, a line of
cli/flags/validators.py; the library checks every value anyway).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Optional, Tuple

import estimator_multigpu as emg

TOWERS, OPTIMIZATION = "Towers", "Optimization"  # --help groups.
_TYPES = {"float": Optional[float], "integer": int, "bool": bool,
          "enum": Optional[str]}


@dataclasses.dataclass(frozen=True)
class OptionFlag:
  """A flag of train.py that sets a `multi_gpu` option.

  Attributes:
    option: the `Options` field it sets.
    kind: "float", "integer", "bool" or "enum" (absl's DEFINE_<kind>).
    help: the flag's help text.
    group: its `--help` group (cli/flags/grouped_help.py).
    flag: the flag's name (default: `option`).
    choices: an enum's values.
    every_script: defined for eval.py and export.py too (which refuse it:
      cli/flags/use_table.py).
  """
  option: str
  kind: str
  help: str
  group: str
  flag: Optional[str] = None
  choices: Tuple[str, ...] = ()
  every_script: bool = False

  @property
  def name(self) -> str:
    """The flag's name."""
    return self.flag or self.option

  @property
  def default(self):
    """The option's default (`multi_gpu`'s, which are `Options`')."""
    return _DEFAULTS[self.option]


_DEFAULTS = {name: parameter.default for name, parameter in
             inspect.signature(emg.multi_gpu).parameters.items()}
ROWS = (
    OptionFlag("ema_decay", "float", "Keep an exponential moving average of "
               "the weights with this decay, e.g. 0.999.", OPTIMIZATION,
               flag="moving_average_decay", every_script=True),
    OptionFlag("clip_gradients_by_norm", "float", "Clip the combined "
               "gradient to this global norm.", OPTIMIZATION),
    OptionFlag("variable_update", "enum", "auto: replicated with 2+ GPU "
               "towers or an all-reduce cluster (no ps), shared otherwise; "
               "shared: one copy of the variables on the aggregation device "
               "(tf_cnn_benchmarks parameter_server); replicated: a copy per "
               "tower and all-reduced gradients (tf_cnn_benchmarks "
               "replicated).", TOWERS,
               choices=tuple(emg.VARIABLE_UPDATES)),
    OptionFlag("sync_batch_norm", "bool", "Batch norm over the global batch: "
               "the towers all-reduce their moments, so N towers train "
               "batch-norm nets (resnet_*, inception_*) exactly like one "
               "device. Eval, predict and export are unchanged.", TOWERS),
    OptionFlag("accumulate_steps", "integer", "Apply one update per K input "
               "batches (gradient accumulation); the effective batch is K x "
               "--batch_size and global_step counts updates.", OPTIMIZATION),
    OptionFlag("mixed_precision", "enum", "Compute in the towers in this "
               "precision (float32 master weights; float16 with dynamic loss "
               "scaling).", TOWERS, choices=("bfloat16", "float16")),
)


def in_group(group: str) -> Tuple[str, ...]:
  """The flags of the rows in `--help` group `group`, in row order."""
  return tuple(row.name for row in ROWS if row.group == group)


def _options(self) -> dict:
  """{`Options` field: value}: the keyword options of `emg.multi_gpu`."""
  return {row.option: getattr(self, row.name) for row in ROWS}


MultiGpuSettings = dataclasses.make_dataclass(
    "MultiGpuSettings",
    [(row.name, _TYPES[row.kind], dataclasses.field(default=row.default))
     for row in ROWS],
    namespace={"options": _options, "__module__": __name__, "__doc__": (
        "train.py's options of `emg.multi_gpu`, one field per flag of "
        "`ROWS` (`moving_average_decay` is its `ema_decay`); `options()` "
        "names them as `multi_gpu` does.")},
    frozen=True)
