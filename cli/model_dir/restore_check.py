"""Does the model_dir's own checkpoint fit the graph this run builds?

Estimator restores every variable of its graph from the model_dir's latest
checkpoint. When that checkpoint was written with another net, class count,
optimizer or without moving averages, the restore fails deep in TensorFlow
(`NotFoundError: Restoring from checkpoint failed`), or, when the checkpoint
is already at --max_steps, Estimator skips training and exits 0. This module
compares the two lists of variables (names and shapes, from
`tf.train.list_variables` and from the run's graph built in a scratch
`tf.Graph`) before anything runs, and says what the checkpoint was written
with, e.g.

  --model_dir=runs/a holds model.ckpt-20, written with --num_classes=10
  (LeNet/fc4/biases is [10]); this run builds --num_classes=5 ([5]). ...

The truth is the checkpoint's variables: net from their top scope,
optimizer from the slot names (`w/Momentum`, `w/Adam`), classes from the
logits' shape, moving averages from `w/ExponentialMovingAverage`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from typing import Dict, List, Optional

from absl import logging
import tensorflow as tf

import nets

tf1 = tf.compat.v1
Shapes = Dict[str, List[int]]
EMA_SUFFIX = "/ExponentialMovingAverage"
SLOTS = {"Momentum": "momentum", "Adam": "adam", "RMSProp": "rmsprop",
         "Adagrad": "adagrad", "Adadelta": "adadelta", "Ftrl": "ftrl"}


def _key(name: str) -> str:
  return re.sub(r"[^a-z0-9]", "", name.lower())


_NETS_BY_SCOPE = {_key(name): name for name in nets.NETWORK_NAMES}


def checkpoint_shapes(checkpoint: str) -> Shapes:
  """name -> shape of the checkpoint's variables."""
  return {name: list(shape) for name, shape in
          tf.train.list_variables(checkpoint)}


def graph_shapes(model_fn, mode: str, features_spec, labels_spec,
                 config: tf.estimator.RunConfig) -> Shapes:
  """name -> shape of the global variables `model_fn` creates.

  Args:
    model_fn: `(features, labels, mode, config)`, e.g. `Estimator.model_fn`.
    mode: a `tf.estimator.ModeKeys`.
    features_spec, labels_spec: `tf.TensorSpec`s (labels: None for PREDICT),
      e.g. the input dataset's `element_spec`.
    config: the Estimator's RunConfig.
  """
  with tf.Graph().as_default(), _quiet():
    tf1.train.get_or_create_global_step()
    features = tf1.placeholder(features_spec.dtype, features_spec.shape)
    labels = None if labels_spec is None else tf1.placeholder(
        labels_spec.dtype, labels_spec.shape)
    model_fn(features, labels, mode, config)
    return {variable.op.name: variable.shape.as_list()
            for variable in tf1.global_variables()}


@contextlib.contextmanager
def _quiet():
  """No INFO/WARNING lines from the scratch graph (the run logs its own)."""
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)
  try:
    yield
  finally:
    logging.set_verbosity(verbosity)


def one_tower(towers):
  """`towers` (cli/towers.py Towers) cut to the first: the variables are the
  same for any tower count, and one tower builds N times faster."""
  return dataclasses.replace(towers, devices=towers.devices[:1])


def net_of(shapes: Shapes) -> Optional[str]:
  """The network whose top scope holds the most variables (None: unknown)."""
  scopes = [name.split("/")[0] for name in shapes
            if "/" in name and not name.startswith("tower_")]
  if not scopes:
    return None
  top = max(sorted(set(scopes)), key=scopes.count)
  return _NETS_BY_SCOPE.get(_key(top), top)


def optimizer_of(shapes: Shapes) -> str:
  """The optimizer whose slots the variables hold (`sgd`: none)."""
  for name in shapes:
    slot = name.rsplit("/", 1)[-1]
    if slot in SLOTS:
      return SLOTS[slot]
  return "sgd"


def has_averages(shapes: Shapes) -> bool:
  return any(name.endswith(EMA_SUFFIX) for name in shapes)


def _step(checkpoint: str) -> str:
  return checkpoint.rsplit("-", 1)[-1]


def mismatch(saved: Shapes, built: Shapes, num_classes: int) -> Optional[str]:
  """What the checkpoint was written with that this graph does not fit
  (None: every variable of `built` is in `saved` with its shape)."""
  missing = sorted(set(built) - set(saved))
  different = [name for name in sorted(set(built) & set(saved))
               if saved[name] != built[name]]
  if not missing and not different:
    return None
  saved_net, built_net = net_of(saved), net_of(built)
  if saved_net != built_net:
    return (f"written with --model_name={saved_net}; this run builds "
            f"--model_name={built_net}")
  if has_averages(built) and not has_averages(saved):
    return ("which has no moving averages (it was trained without "
            "--moving_average_decay); this run asks for them")
  if different:
    name = different[0]
    return _shape_mismatch(name, saved[name], built[name], num_classes)
  slots = [name for name in missing if name.rsplit("/", 1)[-1] in SLOTS]
  if slots:
    return (f"written with --optimizer={optimizer_of(saved)}; this run uses "
            f"--optimizer={optimizer_of(built)} (its slot {slots[0]} is "
            "not in the checkpoint)")
  return (f"which lacks {len(missing)} variable(s) of this run's graph, e.g. "
          f"{missing[0]}")


def _shape_mismatch(name: str, saved: list, built: list,
                    num_classes: int) -> str:
  if saved[:-1] == built[:-1] and built[-1:] == [num_classes]:
    return (f"written with --num_classes={saved[-1]} ({name} is {saved}); "
            f"this run builds --num_classes={num_classes} ({built})")
  if len(saved) == 4 and saved[:2] + saved[3:] == built[:2] + built[3:]:
    return (f"for {saved[2]}-channel images ({name} is {saved}); this run "
            f"reads {built[2]}-channel images ({built}: another "
            "--dataset_name?)")
  return (f"with {name} of shape {saved}; this run builds {built} (another "
          "--image_size?)")


def check(model_dir: str, built: Shapes, num_classes: int,
          checkpoint: Optional[str] = None) -> None:
  """Raises when the model_dir's latest checkpoint cannot be restored.

  Args:
    model_dir: the run's --model_dir (no checkpoint: nothing to check).
    built: `graph_shapes` of the run's graph.
    num_classes: the class count this run builds.
    checkpoint: the checkpoint to check instead of the latest.

  Raises:
    ValueError: saying what the checkpoint was written with and the fix.
  """
  checkpoint = checkpoint or tf.train.latest_checkpoint(model_dir)
  if checkpoint is None:
    return
  wrong = mismatch(checkpoint_shapes(checkpoint), built, num_classes)
  if wrong is None:
    return
  fix = ("drop --moving_average_decay" if "moving averages" in wrong else
         "give the flags it was written with")
  raise ValueError(
      f"--model_dir={model_dir} holds {os.path.basename(checkpoint)} (step "
      f"{_step(checkpoint)}), {wrong}, so it cannot be restored. To go on "
      f"with it, {fix}; to start over, choose a new --model_dir.")


def input_specs(input_fn) -> tuple:
  """(features spec, labels spec) of an Estimator input_fn's dataset."""
  with tf.Graph().as_default():
    return input_fn().element_spec


def check_estimator(estimator: tf.estimator.Estimator, specs: tuple,
                    num_classes: int,
                    mode: str = tf.estimator.ModeKeys.TRAIN,
                    checkpoint: Optional[str] = None) -> None:
  """`check` of the graph `estimator` builds in `mode` on inputs `specs`
  ((features, labels) `tf.TensorSpec`s; labels None for PREDICT).

  Raises:
    ValueError: the model_dir's latest checkpoint (or `checkpoint`) does
      not fit that graph.
  """
  checkpoint = checkpoint or tf.train.latest_checkpoint(estimator.model_dir)
  if checkpoint is None:
    return
  check(estimator.model_dir, graph_shapes(
      estimator.model_fn, mode, *specs, estimator.config), num_classes,
        checkpoint)
