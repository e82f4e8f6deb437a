"""Checks of train.py's tf-slim optimization flags, and what they set: the
model_fn's configuration (`classifier_config`).

Names, meanings and (mostly) defaults are tf-slim's train_image_classifier.py
ones. Two differences from slim, kept so that earlier runs mean the same:
`--opt_epsilon` defaults to TensorFlow's 1e-8 for adam and adadelta (slim:
1.0 for all; rmsprop keeps 1.0), and `--learning_rate_decay_factor` to 0.5
(slim: 0.94).

A setting given for another optimizer than `--optimizer`, a decay setting
the `--learning_rate_decay_type` does not use, two flags for the same thing
and ftrl with a decaying rate (its weights scale with the rate) are errors,
never silently ignored. `register_validators()` (called by
cli/flags/definitions.py after it defines `--optimizer` and the schedule
flags) installs the checks; they read which flags were typed (absl
validators).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

from absl import flags
from absl import logging

import classifier
from cli import run_setup
from cli import settings
import datasets

FLAGS = flags.FLAGS
SETTING_HELP = {  # the per-optimizer settings, with their --help.
    "adam_beta1": "adam: decay rate of the first-moment estimates.",
    "adam_beta2": "adam: decay rate of the second-moment estimates.",
    "rmsprop_decay": "rmsprop: decay of the mean square.",
    "rmsprop_momentum": "rmsprop: momentum (--momentum is the momentum "
                        "optimizer's).",
    "adadelta_rho": "adadelta: decay rate.",
    "adagrad_initial_accumulator_value": "adagrad: starting value of the "
                                         "accumulators.",
    "ftrl_learning_rate_power": "ftrl: the learning rate power (<= 0).",
    "ftrl_initial_accumulator_value": "ftrl: starting value of the "
                                      "accumulators.",
    "ftrl_l1": "ftrl: L1 regularization strength.",
    "ftrl_l2": "ftrl: L2 regularization strength.",
}
SETTINGS = tuple(SETTING_HELP) + ("opt_epsilon",)  # per-optimizer setting flags.
DECAY_FLAGS = ("learning_rate_decay_factor", "num_epochs_per_decay",
               "staircase")

def typed_flags(names) -> list:
  """The flags among `names` on the command line."""
  return [name for name in names if FLAGS[name].present]


def misapplied_settings(optimizer: str, given: list) -> Optional[str]:
  """Why settings given do not fit `optimizer` (None: they do).

  Args:
    optimizer: the `--optimizer`.
    given: names of the flags given.
  """
  used = classifier.OPTIMIZER_SETTINGS[optimizer]
  for name in given:
    owners = [o for o, names in classifier.OPTIMIZER_SETTINGS.items()
              if name in names]
    if owners and name not in used:
      hint = (" (rmsprop's momentum is --rmsprop_momentum)"
              if name == "momentum" and optimizer == "rmsprop" else "")
      return (f"--{name} is a setting of --optimizer={'|'.join(owners)}, "
              f"but --optimizer={optimizer} has no use for it; drop "
              f"--{name} or choose --optimizer={owners[0]}{hint}.")
  return None


def misapplied_decay(decay_type: str, given: list) -> Optional[str]:
  """Why decay flags given do not fit `decay_type` (None: they do)."""
  for name in ("learning_rate_decay_factor", "staircase"):
    if name in given and decay_type != "exponential":
      return (f"--{name} shapes the 'exponential' decay, but "
              f"--learning_rate_decay_type={decay_type} (tf-slim's default "
              "is exponential, this project's cosine); add "
              f"--learning_rate_decay_type=exponential or drop --{name}.")
  if "num_epochs_per_decay" in given and decay_type == "fixed":
    return ("--num_epochs_per_decay sets the decay period, but "
            "--learning_rate_decay_type=fixed does not decay; choose "
            "exponential, polynomial or cosine, or drop it.")
  return None


def duplicated_flags(given: list) -> Optional[str]:
  """Why two flags given say the same thing (None: they do not)."""
  if "num_epochs_per_decay" in given and "decay_steps" in given:
    return ("--num_epochs_per_decay and --decay_steps both set the decay "
            "period (in epochs and in steps); give only one of them.")
  return None


def decaying_ftrl(optimizer: str, decay_type: str) -> Optional[str]:
  """Why ftrl cannot take a decaying rate (None: no ftrl, or a fixed rate)."""
  if optimizer != "ftrl" or decay_type == "fixed":
    return None
  return (f"--optimizer=ftrl with --learning_rate_decay_type={decay_type}: "
          "FTRL's weights are proportional to the current learning rate, so "
          "a decaying rate shrinks the model towards 0; add "
          "--learning_rate_decay_type=fixed.")


def _problem(values: dict, given: list) -> Optional[str]:
  """What is wrong with the flags of a multi-flag validator's `values`."""
  optimizer = values.get("optimizer")
  decay_type = values.get("learning_rate_decay_type")
  return (duplicated_flags(given) or
          (optimizer and misapplied_settings(optimizer, given)) or
          (decay_type and misapplied_decay(decay_type, given)) or
          (optimizer and decay_type and decaying_ftrl(optimizer, decay_type)))


def _check_combination(values: dict) -> bool:
  """A multi-flag validator: the flags of `values` fit the optimizer and
  the decay type among them."""
  given = typed_flags(name for name in values if name not in (
      "optimizer", "learning_rate_decay_type"))
  if not values.get("staircase") and "staircase" in given:
    given.remove("staircase")  # --nostaircase asks for nothing.
  problem = _problem(values, given)
  if problem:
    raise flags.ValidationError(problem)
  return True


def _range_validator(name: str, field: str) -> None:
  expected = classifier.SETTING_RANGES[field][1]
  flags.register_validator(
      name, lambda value: value is None or classifier.in_range(field, value),
      message=f"expected {expected}; give such a value, or drop --{name} "
              "for the default.")


def register_validators() -> None:
  """Installs the checks (after `--optimizer` and the schedule flags exist)."""
  for name in SETTINGS:
    _range_validator(name, name)
  _range_validator("learning_rate_decay_factor", "decay_rate")
  flags.register_validator(
      "num_epochs_per_decay",
      lambda value: value is None or (math.isfinite(value) and value > 0),
      message="expected a number of epochs > 0, e.g. tf-slim's 2.0.")
  # Pairs, so that absl's message names only the two flags concerned.
  pairs = [("optimizer", name) for name in ("momentum",) + SETTINGS] + [
      ("learning_rate_decay_type", name) for name in DECAY_FLAGS] + [
          ("decay_steps", "num_epochs_per_decay"),
          ("optimizer", "learning_rate_decay_type")]
  for pair in pairs:
    flags.register_multi_flags_validator(list(pair), _check_combination)


def decay_steps(num_epochs: float, examples_per_epoch: int,
                examples_per_step: int) -> int:
  """tf-slim's decay period in steps: int(epoch / batch x epochs), >= 1."""
  return max(1, int(examples_per_epoch / examples_per_step * num_epochs))


def classifier_settings(optimization: settings.OptimizationSettings,
                        optimizer: settings.OptimizerSettings,
                        examples_per_epoch: Callable[[], int],
                        examples_per_step: int) -> dict:
  """The ClassifierConfig fields the tf-slim settings set.

  Args:
    optimization: the schedule (decay factor, staircase, epochs per decay).
    optimizer: the per-optimizer settings.
    examples_per_epoch: returns the training split's size (called only
      with `num_epochs_per_decay`).
    examples_per_step: examples one global step trains on.
  """
  fields = dataclasses.asdict(optimizer)
  fields.update(decay_rate=optimization.learning_rate_decay_factor,
                staircase=optimization.staircase)
  if optimization.num_epochs_per_decay is not None:
    fields["decay_steps"] = decay_steps(optimization.num_epochs_per_decay,
                                        examples_per_epoch(),
                                        examples_per_step)
  return fields


def epoch_size(data: settings.DataSettings,
               setup: Optional[run_setup.ModelSetup] = None) -> int:
  """Examples in one epoch of the training split (tfrecord: counted):
  `setup`'s data (train.py's, cli/run_setup.py), else the settings'."""
  name, directory, split = (
      (setup.dataset_name, setup.dataset_dir, setup.dataset_split_name)
      if setup else (data.dataset_name, data.dataset_dir,
                     data.dataset_split_name or run_setup.TRAIN_SPLIT))
  size = datasets.num_examples(name, split, directory)
  logging.info("An epoch of split %r of %s holds %d examples.", split, name,
               size)
  return size


def classifier_config(settings: settings.TrainSettings, num_classes: int,
                      sync_replicas: int = 0,
                      model_name: Optional[str] = None,
                      setup: Optional[run_setup.ModelSetup] = None
                      ) -> classifier.ClassifierConfig:
  """The model_fn's configuration (`model_name`: the net, default the
  settings'; `setup`: the data, default the settings')."""
  opt = settings.optimization
  decay_steps = opt.decay_steps or max(opt.max_steps - opt.warmup_steps, 1)
  slim = classifier_settings(
      opt, settings.optimizer, lambda: epoch_size(settings.data, setup),
      settings.data.batch_size * settings.multi_gpu.accumulate_steps *
      max(sync_replicas, 1))
  return classifier.ClassifierConfig(
      model_name=model_name or settings.model.model_name,
      num_classes=num_classes, weight_decay=opt.weight_decay,
      label_smoothing=opt.label_smoothing, optimizer=opt.optimizer,
      learning_rate=opt.learning_rate, momentum=opt.momentum,
      learning_rate_decay_type=opt.learning_rate_decay_type,
      end_learning_rate=opt.end_learning_rate,
      warmup_steps=opt.warmup_steps, sync_replicas=sync_replicas,
      **{"decay_steps": decay_steps, **slim})
