"""Fine-tuning for train.py, with tf-slim's flags and meanings.

    python train.py --model_dir=runs/new --checkpoint_path=runs/digits \\
        --checkpoint_exclude_scopes=LeNet/fc4 --trainable_scopes=LeNet/fc4

- `--checkpoint_path`: a checkpoint, or a
  directory whose latest checkpoint is used. It initializes the net only
  when `--model_dir` has no checkpoint yet; a resume ignores it (INFO line).
- `--checkpoint_exclude_scopes`: variables whose name starts with one of
  these are not restored (slim's prefix match), e.g. the logits of another
  class count; they start freshly initialized.
- `--ignore_missing_vars`: variables the checkpoint lacks keep their fresh
  initial values (a log line lists them); without it they are an error.
- `--trainable_scopes`: only variables whose name matches one of these
  (slim's `get_collection` regex, from the start of the name) train; the
  rest stay frozen. The scopes go into `ClassifierConfig.trainable_scopes`
  and run_config.json; a resume without the flag keeps the recorded ones.

The restore is Estimator's `WarmStartSettings`, with `vars_to_warm_start`
the exact names of the net's own variables (weights, biases, batch-norm
statistics: those of a one-device build, which is what checkpoints hold
whatever the towers). The source's moving averages, optimizer slots and
`global_step` are never read: slots start fresh, the step at 0, and with
--moving_average_decay each average starts at its variable's restored
value. Everything is checked against the checkpoint before training
(names, shapes), so a mistake is one error naming the variables and the
flag that fixes it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Optional, Sequence

from absl import logging
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu import slim_compat

import classifier
from cli import settings as settings_lib
from cli.model_dir import checkpoints
from cli.model_dir import run_config
import nets

tf1 = tf.compat.v1
SHOWN = 8  # variable names listed in a message, at most.
EMA_SUFFIX = "ExponentialMovingAverage"  # a shadow's name: `w/` + this.

@dataclasses.dataclass(frozen=True)
class NetVariable:
  """One variable of the net as a one-device build names it."""
  name: str
  shape: tuple
  trainable: bool
  averaged: bool  # with --moving_average_decay, it has a shadow (emg.averaged_variables).


def net_variables(config: classifier.ClassifierConfig,
                  input_fn: Callable[[], tf.data.Dataset]) -> list:
  """The net's own variables, built once in a scratch graph.

  Args:
    config: the classifier (net, classes) being trained.
    input_fn: the training input; only its image spec is used.

  Returns:
    A `NetVariable` per variable of the net, in creation order.
  """
  slim_compat.apply_all()  # tf-slim's batch norm on TF 2.15.
  with tf.Graph().as_default():
    spec = input_fn().element_spec[0]
    images = tf1.placeholder(spec.dtype, spec.shape)
    network_fn = nets.get_network_fn(config.model_name, config.num_classes,
                                     config.weight_decay, is_training=True)
    network_fn(images)
    trainable = set(tf1.trainable_variables())
    averaged = set(emg.averaged_variables())
    return [NetVariable(v.op.name, tuple(v.shape.as_list()), v in trainable,
                        v in averaged) for v in tf1.global_variables()]


def _listed(names: Sequence[str]) -> str:
  """The first SHOWN names, comma-separated, and how many more."""
  names = list(names)
  more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
  return ", ".join(names[:SHOWN]) + more


def _scopes_of(names: Sequence[str]) -> list:
  """The enclosing scopes of `names` (`LeNet/fc4` for `LeNet/fc4/weights`)."""
  return list(dict.fromkeys(name.rsplit("/", 1)[0] for name in names))


def check_scopes_match(flag: str, scopes: Sequence[str], names: Sequence[str],
                       matches: Callable[[str, str], bool]) -> None:
  """Raises when a scope of `--flag` matches none of `names`.

  Raises:
    ValueError: naming the scope and listing the net's scopes.
  """
  for scope in scopes:
    if not any(matches(name, scope) for name in names):
      raise ValueError(
          f"--{flag}: {scope!r} matches no variable of the net; expected "
          f"one of its scopes: {_listed(_scopes_of(names))} (a scope "
          f"matches from the start of a name). Fix the scope or drop it "
          f"from --{flag}.")


def excluded(name: str, scope: str) -> bool:
  """slim's --checkpoint_exclude_scopes test: a prefix of the name."""
  return name.startswith(scope)


def trainable(name: str, scope: str) -> bool:
  """slim's --trainable_scopes test (`get_collection`'s regex match)."""
  return classifier.in_scopes(name, (scope,))


def _stored_shapes(checkpoint: str) -> dict:
  """name -> shape of the checkpoint's variables.

  Raises:
    ValueError: the checkpoint cannot be read.
  """
  try:
    return {name: tuple(shape)
            for name, shape in tf.train.list_variables(checkpoint)}
  except (tf.errors.OpError, ValueError) as error:
    raise ValueError(
        f"--checkpoint_path={checkpoint} cannot be read ({error}); give an "
        "intact checkpoint.") from error


def _check_present(checkpoint: str, names: Sequence[str], stored: dict,
                   ignore_missing: bool) -> list:
  """The names the checkpoint holds; the others are an error or logged.

  Raises:
    ValueError: some are missing and not `ignore_missing`.
  """
  missing = [name for name in names if name not in stored]
  if missing and not ignore_missing:
    raise ValueError(
        f"--checkpoint_path={checkpoint} lacks {len(missing)} variable(s) "
        f"of the net: {_listed(missing)} (it holds "
        f"{_listed(sorted(stored))}). Exclude them with "
        f"--checkpoint_exclude_scopes={','.join(_scopes_of(missing))}, or "
        "pass --ignore_missing_vars to keep their initial values.")
  if missing:
    logging.warning("--ignore_missing_vars: %d variable(s) not in %s keep "
                    "their initial values: %s", len(missing), checkpoint,
                    ", ".join(missing))
  return [name for name in names if name in stored]


def _check_shapes(checkpoint: str, variables: Sequence[NetVariable],
                  stored: dict) -> None:
  """Raises when a variable to restore has another shape in the checkpoint.

  Raises:
    ValueError: naming each variable, both shapes and the flag.
  """
  wrong = [v for v in variables if stored[v.name] != v.shape]
  if wrong:
    shapes = "; ".join(f"{v.name}: {list(stored[v.name])} in the checkpoint,"
                       f" {list(v.shape)} in the net" for v in wrong)
    raise ValueError(
        f"--checkpoint_path={checkpoint} has other shapes than the net for "
        f"{len(wrong)} variable(s): {shapes} (a new class count changes "
        "the logits). To start them fresh instead of restoring them, pass "
        "--checkpoint_exclude_scopes="
        f"{','.join(_scopes_of([v.name for v in wrong]))}.")


def _check_same_net(checkpoint: str, variables: Sequence[NetVariable],
                    stored: dict) -> None:
  """Raises when the checkpoint holds none of the net's variables: another
  net's (one message: excluding them all would only lead to another).

  Raises:
    ValueError: naming both nets' variables and the fix.
  """
  names = [v.name for v in variables]
  if names and not any(name in stored for name in names):
    raise ValueError(
        f"--checkpoint_path={checkpoint} is another net's: it holds none of "
        f"the {len(names)} variables of the net --model_name builds "
        f"({_listed(names)}; it holds {_listed(sorted(stored))}). Give a "
        "checkpoint of that net, or the --model_name of the checkpoint's "
        "net.")


def restored_names(checkpoint: str, variables: Sequence[NetVariable],
                   exclude_scopes: Sequence[str],
                   ignore_missing: bool) -> list:
  """The names of the net's variables to restore from `checkpoint`.

  Raises:
    ValueError: an exclude scope matches nothing; a variable is missing
      (without `ignore_missing`) or has another shape; nothing would be
      restored.
  """
  check_scopes_match("checkpoint_exclude_scopes", exclude_scopes,
                     [v.name for v in variables], excluded)
  kept = [v for v in variables
          if not any(excluded(v.name, scope) for scope in exclude_scopes)]
  stored = _stored_shapes(checkpoint)
  _check_same_net(checkpoint, variables, stored)
  present = _check_present(checkpoint, [v.name for v in kept], stored,
                           ignore_missing)
  _check_shapes(checkpoint, [v for v in kept if v.name in present], stored)
  if not present:
    raise ValueError(
        f"--checkpoint_path={checkpoint} holds none of the variables to "
        f"restore ({_listed([v.name for v in kept]) or 'all excluded'}): "
        "is it another net's? Give a checkpoint of --model_name's net.")
  return present


def warm_start_settings(checkpoint: str, names: Sequence[str],
                        shadows: Sequence[str] = ()
                        ) -> tf.estimator.WarmStartSettings:
  """Estimator's warm start of exactly `names` (one-device variable names).

  Each name is an anchored regex over GLOBAL_VARIABLES (`name:0`), so no
  optimizer slot, tower copy or `global_step` matches. The moving average
  of each of `shadows` (a subset of `names`) starts at the variable's
  restored value, as a fresh shadow starts at its variable's initial
  value; the source's own averages are not read.
  """
  renames = {f"{name}/{EMA_SUFFIX}": name for name in shadows}
  return tf.estimator.WarmStartSettings(
      ckpt_to_initialize_from=checkpoint,
      vars_to_warm_start=[re.escape(name) + ":0$"
                          for name in [*names, *renames]],
      var_name_to_prev_var_name=renames)


def _check_needs_checkpoint_path(
    settings: settings_lib.FineTuningSettings) -> None:
  """Raises when a restore setting is given without a checkpoint_path."""
  for name in ("checkpoint_exclude_scopes", "ignore_missing_vars"):
    if getattr(settings, name) and not settings.checkpoint_path:
      raise ValueError(
          f"--{name} is given, but it applies to the restore from "
          "--checkpoint_path, which is not. Give the checkpoint to "
          f"fine-tune from (--checkpoint_path), or drop --{name}.")


def source_checkpoint(settings: settings_lib.FineTuningSettings,
                      model_dir: str) -> Optional[str]:
  """`checkpoint_path` resolved, or None: not given, or a resume.

  Raises:
    FileNotFoundError: `checkpoint_path` names no checkpoint.
  """
  _check_needs_checkpoint_path(settings)
  if not settings.checkpoint_path:
    return None
  existing = tf.train.latest_checkpoint(model_dir)
  if existing:
    logging.info("Ignoring --checkpoint_path=%s: --model_dir=%s already has "
                 "a checkpoint (%s), so training resumes from it.",
                 settings.checkpoint_path, model_dir, existing)
    return None
  return checkpoints.resolve_checkpoint(settings.checkpoint_path)


def trainable_scopes(scopes: Optional[Sequence[str]],
                     record: Optional[run_config.RunRecord],
                     model_dir: str) -> tuple:
  """`scopes` (--trainable_scopes), else on a resume the recorded ones,
  else ()."""
  if scopes is not None:
    return tuple(scopes)
  recorded = record.classifier.trainable_scopes if record else ()
  if recorded and tf.train.latest_checkpoint(model_dir):
    logging.info("Training only --trainable_scopes=%s, as recorded in %s; "
                 "--trainable_scopes= trains every variable.",
                 ",".join(recorded), run_config.path(model_dir))
    return tuple(recorded)
  return ()


def apply(settings: settings_lib.FineTuningSettings,
          config: classifier.ClassifierConfig,
          record: Optional[run_config.RunRecord], model_dir: str,
          input_fn: Callable[[], tf.data.Dataset],
          averaged: bool = False) -> tuple:
  """The fine-tuning settings applied to a training run.

  Args:
    settings: the fine-tuning flags' values.
    config: the classifier from the other settings.
    record: the model_dir's run_config.json record (None: none).
    model_dir: where this run writes its checkpoints.
    input_fn: the training input (its image spec builds the net).
    averaged: the run keeps moving averages (--moving_average_decay): each
      restored variable's average starts at its restored value.

  Returns:
    `(config with trainable_scopes, WarmStartSettings or None)`.

  Raises:
    ValueError, FileNotFoundError: a fine-tuning setting that cannot work,
      with the fix.
  """
  config = dataclasses.replace(config, trainable_scopes=trainable_scopes(
      settings.trainable_scopes, record, model_dir))
  checkpoint = source_checkpoint(settings, model_dir)
  if checkpoint is None and not config.trainable_scopes:
    return config, None
  variables = net_variables(config, input_fn)
  check_scopes_match("trainable_scopes", config.trainable_scopes,
                     [v.name for v in variables if v.trainable], trainable)
  if checkpoint is None:
    return config, None
  return config, _warm_start(checkpoint, variables, settings, averaged)


def _warm_start(checkpoint: str, variables: Sequence[NetVariable],
                settings: settings_lib.FineTuningSettings,
                averaged: bool) -> tf.estimator.WarmStartSettings:
  """The checked restore of the net from `checkpoint`, logged."""
  names = restored_names(checkpoint, variables,
                         settings.checkpoint_exclude_scopes or (),
                         settings.ignore_missing_vars)
  logging.info("Fine-tuning from %s: %d of the net's %d variables restored; "
               "fresh: %s", checkpoint, len(names), len(variables),
               _listed([v.name for v in variables if v.name not in names])
               or "none")
  shadows = ([v.name for v in variables if v.averaged and v.name in names]
             if averaged else [])
  return warm_start_settings(checkpoint, names, shadows)
