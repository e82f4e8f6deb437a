"""The decorator's options: one field each, checked when the model_fn is
wrapped.

`Options` is the one source of the options' names, defaults and checks:
`multi_gpu`'s keyword arguments are its fields in order, with their
defaults (tests/core/test_options_source.py holds the two together), and
`check_options` runs each field's own check (its metadata) before the
checks of options together. Mistakes raise at once, naming the option, what
was given, what was expected and how to fix it; what can only be known
from the graph (the devices a session will have) is checked when the graph
is built. A new option is a field here with its check, the keyword in
`multi_gpu`'s signature and docstring, and the code that uses it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

from estimator_multigpu import devices as devices_lib
from estimator_multigpu import strategies
from estimator_multigpu.graph import plan as plan_lib
from estimator_multigpu.graph import precision
from estimator_multigpu.graph import prediction_padding
from estimator_multigpu.strategies import all_reduce as all_reduce_lib
from estimator_multigpu.update import accumulation

LOSS_REDUCTIONS = ("mean", "sum")


def _option(default: Any, check: Callable[[Any], Any]) -> Any:
  """A field of `Options`: its default and the check that returns the
  value to keep (raising TypeError or ValueError for a bad one)."""
  return dataclasses.field(default=default, metadata={"check": check})


def _one_of(name: str, choices: Sequence[str],
            meaning: str) -> Callable[[Any], Any]:
  """The check of a name among `choices` (None passes when it is one)."""
  def check(value):
    if value not in choices:
      raise ValueError(
          f"`{name}` is {value!r}; expected one of "
          f"{', '.join(repr(c) for c in choices if c is not None)}"
          f"{meaning}.")
    return value
  return check


_check_loss_reduction = _one_of(
    "loss_reduction", LOSS_REDUCTIONS, ": 'mean' when the model_fn's loss is "
    "a mean over its examples, 'sum' when it is a sum")
_check_variable_update = _one_of(
    "variable_update", strategies.VARIABLE_UPDATES, " ('auto': all-reduce "
    "between GPU towers and tasks, shared variables on CPUs)")
_check_synchronization_name = _one_of(
    "synchronization", strategies.SYNCHRONIZATIONS, ": 'sync' (the towers' "
    "gradients are combined into one update) or 'async' (every tower "
    "applies its own gradient)")
_check_all_reduce_name = _one_of(
    "all_reduce", (None,) + tuple(all_reduce_lib.ALGORITHMS), ": 'collective' "
    "(NCCL on GPUs, a ring on CPUs), 'add_n' (one sum on the aggregation "
    "device that every tower reads) or 'hierarchical' (within each task, "
    "then across tasks once)")


def _true_or_false(name: str, example: str) -> Callable[[Any], bool]:
  """The check of an option that is True or False (not a truthy value)."""
  def check(value) -> bool:
    if not isinstance(value, bool):
      raise TypeError(
          f"`{name}` must be True or False; got {value!r} "
          f"({type(value).__name__}). {example}")
    return value
  return check


_check_sync_batch_norm = _true_or_false(
    "sync_batch_norm", "Pass sync_batch_norm=True to compute batch-norm "
    "moments over the global batch.")
_check_global_batch = _true_or_false(
    "global_batch", "Pass global_batch=True to run the ops that couple the "
    "examples of a batch on the global batch.")
_check_use_ema_weights = _true_or_false(
    "use_ema_weights", "Pass use_ema_weights=False to evaluate and export "
    "the trained weights rather than their moving average.")


def _aggregation_device(value) -> Optional[str]:
  return None if value is None else devices_lib.canonical_device(
      value, option="aggregation_device")


def _check_packing_bytes(value) -> Optional[int]:
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, int):
    raise TypeError("`gradient_packing_bytes` must be an int or None; got "
                    f"{value!r}.")
  if value < 0:
    raise ValueError(
        f"`gradient_packing_bytes` is {value}; expected 0 (no packing) or a "
        "positive buffer size in bytes, e.g. 32 << 20.")
  return value


def _open_interval(name, low, high, example) -> Callable[[Any], Any]:
  """The check of a number in (low, high), or None (off)."""
  def check(value):
    if value is None:
      return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise TypeError(f"`{name}` must be a number or None; got {value!r}.")
    if not low < value < high:
      raise ValueError(
          f"`{name}` is {value}; expected a number in ({low}, {high}), "
          f"{example}, or None to turn it off.")
    return value
  return check


def _feature_keys(keys) -> tuple:
  """`unsplit_features` as a tuple of feature keys."""
  if isinstance(keys, (str, bytes)) or not isinstance(
      keys, (list, tuple, set, frozenset)) or not all(
          isinstance(key, str) for key in keys):
    raise TypeError(
        f"`unsplit_features` must be a list of feature keys (strings); got "
        f"{keys!r}. Example: unsplit_features=['vocab'].")
  return tuple(keys)


@dataclasses.dataclass(frozen=True)
class Options:
  """`multi_gpu`'s options (see its docstring for their meaning), in its
  signature's order, with its defaults; `check_options` makes a checked one.

  After the check `devices` holds one device group (a list) per tower, or
  None for the default devices (`groups`), and `aggregation_device` its
  canonical spelling; the other fields are the values as given.
  """
  devices: plan_lib.DevicesOption = _option(None, plan_lib.resolve_groups)
  aggregation_device: Optional[str] = _option(None, _aggregation_device)
  loss_reduction: str = _option("mean", _check_loss_reduction)
  ema_decay: Optional[float] = _option(
      None, _open_interval("ema_decay", 0.0, 1.0, "e.g. 0.999"))
  clip_gradients_by_norm: Optional[float] = _option(
      None, _open_interval("clip_gradients_by_norm", 0.0, float("inf"),
                           "e.g. 5.0"))
  use_ema_weights: bool = _option(True, _check_use_ema_weights)
  variable_update: str = _option(strategies.AUTO, _check_variable_update)
  unsplit_features: Sequence[str] = _option((), _feature_keys)
  all_reduce: Optional[str] = _option(None, _check_all_reduce_name)
  gradient_packing_bytes: Optional[int] = _option(None, _check_packing_bytes)
  accumulate_steps: int = _option(1, accumulation.check_steps)
  mixed_precision: Optional[str] = _option(
      None, precision.check_mixed_precision)
  sync_batch_norm: bool = _option(False, _check_sync_batch_norm)
  synchronization: str = _option("sync", _check_synchronization_name)
  prediction_pad_value: prediction_padding.PadValue = _option(
      None, prediction_padding.check_pad_value)
  global_batch: bool = _option(True, _check_global_batch)

  @property
  def groups(self) -> Optional[list]:
    """One device group per tower (after `check_options`); None: default."""
    return self.devices

  @property
  def packing_bytes(self) -> int:
    """`gradient_packing_bytes`, its default (64 MiB) when not given."""
    return (all_reduce_lib.DEFAULT_PACKING_BYTES
            if self.gradient_packing_bytes is None else
            self.gradient_packing_bytes)

  @property
  def needs_towers(self) -> bool:
    """Whether one tower must still go through the tower pipeline."""
    return (self.clip_gradients_by_norm is not None or
            self.accumulate_steps > 1 or self.mixed_precision is not None)

  @property
  def asks_for_all_reduce(self) -> bool:
    """Whether an all-reduce option was given (then "auto" replicates)."""
    return (self.all_reduce is not None or
            self.gradient_packing_bytes is not None)


NAMES = tuple(field.name for field in dataclasses.fields(Options))


def check_options(**given: Any) -> Options:
  """Validates `multi_gpu`'s options (`given` by name, the others their
  defaults): each field's own check, then the checks of options together.

  Raises:
    TypeError: an unknown option, or one of the wrong kind.
    ValueError: an option's value is malformed, or two options clash.
  """
  unknown = sorted(set(given) - set(NAMES))
  if unknown:
    raise TypeError(
        f"Unknown `multi_gpu` option(s) {', '.join(unknown)}; the options "
        f"are {', '.join(NAMES)}.")
  options = Options(**{field.name: field.metadata["check"](
      given.get(field.name, field.default))
                        for field in dataclasses.fields(Options)})
  _check_synchronization(options)
  _check_all_reduce(options)
  return options


def _check_synchronization(options: Options) -> None:
  """A strategy (`strategies.choose`) that does both options; one that
  does not wait for the other towers refuses what needs them in step."""
  synchronization = options.synchronization
  if strategies.choose(options.variable_update,
                       synchronization).waits_for_towers:
    return
  clashes = [(options.accumulate_steps != 1,
              f"accumulate_steps={options.accumulate_steps} "
              "(one update from several batches)"),
             (options.sync_batch_norm, "sync_batch_norm=True (towers that "
              "wait for each other's moments)"),
             (options.mixed_precision == "float16", "mixed_precision="
              "'float16' (one loss-scale decision for every tower)")]
  for clash, what in clashes:
    if clash:
      raise ValueError(
          f"synchronization={synchronization!r} was given with {what}; with "
          f"{synchronization!r} every tower applies its own gradient to the "
          "shared variables, without waiting for the others. Drop one of the "
          "two.")


def _check_all_reduce(options: Options) -> None:
  """`all_reduce` and `gradient_packing_bytes` belong to a strategy with a
  copy per tower ("auto" then picks it)."""
  if strategies.choose(options.variable_update, options.synchronization,
                       replicate=True).copies_per_tower:
    return
  for name in ("all_reduce", "gradient_packing_bytes"):
    value = getattr(options, name)
    if value is not None:
      raise ValueError(
          f"`{name}`={value!r} was given with variable_update="
          f"{options.variable_update!r}; it only applies to replicated "
          f"variables. Pass variable_update='replicated' (or 'auto'), or "
          f"drop `{name}`.")
