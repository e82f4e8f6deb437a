"""The decorator's options, checked when the model_fn is wrapped.

Mistakes in an option raise at once, naming the option, what was given, what
was expected and how to fix it; what can only be known from the graph (the
devices a session will have) is checked when the graph is built.
"""

from __future__ import annotations

import dataclasses
from typing import Optional


from estimator_multigpu.update import accumulation
from estimator_multigpu.strategies import all_reduce as all_reduce_lib
from estimator_multigpu import devices as devices_lib
from estimator_multigpu.graph import precision
from estimator_multigpu.graph import plan as plan_lib
from estimator_multigpu.graph import prediction_padding
from estimator_multigpu import strategies
LOSS_REDUCTIONS = ("mean", "sum")


@dataclasses.dataclass(frozen=True)
class Options:
  """The decorator's options, checked (see `multi_gpu` for their meaning)."""
  groups: Optional[list]  # one device group per tower; None = default.
  aggregation_device: Optional[str]
  loss_reduction: str
  ema_decay: Optional[float]
  clip_gradients_by_norm: Optional[float]
  use_ema_weights: bool
  variable_update: str = strategies.AUTO
  unsplit_features: tuple = ()
  all_reduce: Optional[str] = None  # None: `plan.all_reduce_for`.
  gradient_packing_bytes: int = all_reduce_lib.DEFAULT_PACKING_BYTES
  accumulate_steps: int = 1
  mixed_precision: Optional[str] = None
  sync_batch_norm: bool = False
  synchronization: str = "sync"
  packing_given: bool = False  # `gradient_packing_bytes` was given.
  prediction_pad_value: prediction_padding.PadValue = None

  @property
  def needs_towers(self) -> bool:
    """Whether one tower must still go through the tower pipeline."""
    return (self.clip_gradients_by_norm is not None or
            self.accumulate_steps > 1 or self.mixed_precision is not None)

  @property
  def asks_for_all_reduce(self) -> bool:
    """Whether an all-reduce option was given (then "auto" replicates)."""
    return self.all_reduce is not None or self.packing_given


def check_options(*, devices, aggregation_device, loss_reduction, ema_decay,
                  clip_gradients_by_norm, use_ema_weights,
                  variable_update, unsplit_features=(), all_reduce=None,
                  gradient_packing_bytes=None, accumulate_steps=1,
                  mixed_precision=None, sync_batch_norm=False,
                  synchronization="sync",
                  prediction_pad_value=None) -> Options:
  """Validates the decorator's options; messages say how to fix them.

  Raises:
    TypeError, ValueError: an option is malformed.
  """
  if loss_reduction not in LOSS_REDUCTIONS:
    raise ValueError(
        f"`loss_reduction` is {loss_reduction!r}; expected one of "
        f"{', '.join(map(repr, LOSS_REDUCTIONS))}: 'mean' when the model_fn's "
        "loss is a mean over its examples, 'sum' when it is a sum.")
  if variable_update not in strategies.VARIABLE_UPDATES:
    raise ValueError(
        f"`variable_update` is {variable_update!r}; expected one of "
        f"{', '.join(map(repr, strategies.VARIABLE_UPDATES))} ('auto': "
        "all-reduce between GPU towers and tasks, shared variables on CPUs).")
  synchronization = _check_synchronization(
      synchronization, variable_update, accumulate_steps, sync_batch_norm,
      mixed_precision)
  _check_all_reduce(variable_update, synchronization, all_reduce,
                    gradient_packing_bytes)
  if not isinstance(sync_batch_norm, bool):
    raise TypeError(
        f"`sync_batch_norm` must be True or False; got {sync_batch_norm!r} "
        f"({type(sync_batch_norm).__name__}). Pass sync_batch_norm=True to "
        "compute batch-norm moments over the global batch.")
  _check_open_interval("ema_decay", ema_decay, 0.0, 1.0, "e.g. 0.999")
  _check_open_interval("clip_gradients_by_norm", clip_gradients_by_norm,
                       0.0, float("inf"), "e.g. 5.0")
  return Options(
      groups=plan_lib.resolve_groups(devices),
      aggregation_device=(None if aggregation_device is None else
                          devices_lib.canonical_device(aggregation_device)),
      loss_reduction=loss_reduction, ema_decay=ema_decay,
      clip_gradients_by_norm=clip_gradients_by_norm,
      use_ema_weights=bool(use_ema_weights), variable_update=variable_update,
      unsplit_features=_feature_keys(unsplit_features),
      all_reduce=all_reduce,
      gradient_packing_bytes=(all_reduce_lib.DEFAULT_PACKING_BYTES
                              if gradient_packing_bytes is None else
                              gradient_packing_bytes),
      packing_given=gradient_packing_bytes is not None,
      accumulate_steps=accumulation.check_steps(accumulate_steps),
      mixed_precision=precision.check_mixed_precision(
          mixed_precision),
      sync_batch_norm=sync_batch_norm,
      synchronization=synchronization,
      prediction_pad_value=prediction_padding.check_pad_value(
          prediction_pad_value))


def _check_synchronization(synchronization, variable_update,
                           accumulate_steps, sync_batch_norm,
                           mixed_precision) -> str:
  """A strategy (`strategies.choose`) that does both options; one that
  does not wait for the other towers refuses what needs them in step."""
  if synchronization not in strategies.SYNCHRONIZATIONS:
    raise ValueError(
        f"`synchronization` is {synchronization!r}; expected 'sync' (the "
        "towers' gradients are combined into one update) or 'async' (every "
        "tower applies its own gradient).")
  if strategies.choose(variable_update, synchronization).waits_for_towers:
    return synchronization
  clashes = [(accumulate_steps != 1, f"accumulate_steps={accumulate_steps} "
              "(one update from several batches)"),
             (sync_batch_norm, "sync_batch_norm=True (towers that wait for "
              "each other's moments)"),
             (mixed_precision == "float16", "mixed_precision='float16' (one "
              "loss-scale decision for every tower)")]
  for clash, what in clashes:
    if clash:
      raise ValueError(
          f"synchronization={synchronization!r} was given with {what}; with "
          f"{synchronization!r} every tower applies its own gradient to the "
          "shared variables, without waiting for the others. Drop one of the "
          "two.")
  return synchronization


def _feature_keys(keys) -> tuple:
  """`unsplit_features` as a tuple of feature keys."""
  if isinstance(keys, (str, bytes)) or not isinstance(
      keys, (list, tuple, set, frozenset)) or not all(
          isinstance(key, str) for key in keys):
    raise TypeError(
        f"`unsplit_features` must be a list of feature keys (strings); got "
        f"{keys!r}. Example: unsplit_features=['vocab'].")
  return tuple(keys)


def _check_all_reduce(variable_update, synchronization, all_reduce,
                      gradient_packing_bytes) -> None:
  """`all_reduce` and `gradient_packing_bytes` belong to a strategy with a
  copy per tower ("auto" then picks it)."""
  copies = strategies.choose(variable_update, synchronization,
                             replicate=True).copies_per_tower
  for name, value in (("all_reduce", all_reduce),
                      ("gradient_packing_bytes", gradient_packing_bytes)):
    if value is not None and not copies:
      raise ValueError(
          f"`{name}`={value!r} was given with variable_update="
          f"{variable_update!r}; it only applies to replicated variables. "
          f"Pass variable_update='replicated' (or 'auto'), or drop "
          f"`{name}`.")
  if all_reduce is not None and all_reduce not in all_reduce_lib.ALGORITHMS:
    raise ValueError(
        f"`all_reduce` is {all_reduce!r}; expected one of "
        f"{', '.join(map(repr, all_reduce_lib.ALGORITHMS))}: 'collective' "
        "(NCCL on GPUs, a ring on CPUs), 'add_n' (one sum on the "
        "aggregation device that every tower reads) or 'hierarchical' "
        "(within each task, then across tasks once).")
  if gradient_packing_bytes is None:
    return
  if (isinstance(gradient_packing_bytes, bool) or
      not isinstance(gradient_packing_bytes, int)):
    raise TypeError("`gradient_packing_bytes` must be an int or None; got "
                    f"{gradient_packing_bytes!r}.")
  if gradient_packing_bytes < 0:
    raise ValueError(
        f"`gradient_packing_bytes` is {gradient_packing_bytes}; expected 0 "
        "(no packing) or a positive buffer size in bytes, e.g. 32 << 20.")


def _check_open_interval(name, value, low, high, example) -> None:
  if value is None:
    return
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise TypeError(f"`{name}` must be a number or None; got {value!r}.")
  if not low < value < high:
    raise ValueError(
        f"`{name}` is {value}; expected a number in ({low}, {high}), "
        f"{example}, or None to turn it off.")
