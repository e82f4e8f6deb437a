"""Calling the user's model_fn: its arguments, its result, and export graphs.

Estimator tells the model_fn the mode but not whether the graph is a
SavedModel's, which must hold one tower and no device placement (contract
item 8): `is_export_graph` says so, and such a graph is the unwrapped
model_fn, once, on no device. Two signals:

- Every SavedModel Estimator writes (`export_saved_model` in any
  `experimental_mode`, `experimental_export_all_saved_models`' train, eval
  and serve meta graphs, `LatestExporter` / `BestExporter`, TPUEstimator's)
  builds its graph in `Estimator._add_meta_graph_for_mode`: a model_fn
  called while that method is on the call stack builds an export graph,
  whatever the mode. Training and evaluation fed through placeholders
  (`tf.compat.v1.train.FeedFnHook`) are built by `Estimator.train` /
  `evaluate`, with that method nowhere on the stack: they get their towers.
- Outside Estimator, a PREDICT graph whose features are fed through a
  `Placeholder` (a serving input receiver's) is an export graph too
  (calling a wrapped model_fn by hand that way gives the same one-tower
  graph and the same numbers). A hand-built TRAIN or EVAL export outside
  Estimator cannot be told from training: call the unwrapped model_fn.
"""

from __future__ import annotations

import inspect
from typing import Any

import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu.graph import dataflow
from estimator_multigpu.graph import warm_starts

function_utils = compat.internal("function_utils")


ModeKeys = tf.estimator.ModeKeys


def call_model_fn(model_fn, features, labels, mode, params, config):
  """Calls `model_fn` with the arguments it declares; checks what it returns."""
  accepted = tuple(function_utils.fn_args(model_fn))
  kwargs = {name: value for name, value in
            (("params", params), ("config", config), ("mode", mode))
            if name in accepted}
  with warm_starts.scope():
    spec = model_fn(features, labels, **kwargs) if "labels" in accepted else (
        model_fn(features, **kwargs))
  if hasattr(spec, "as_estimator_spec"):  # TPUEstimatorSpec (Google BERT).
    spec = spec.as_estimator_spec()  # host calls once: `readout_apis`.
  if not isinstance(spec, tf.estimator.EstimatorSpec):
    raise TypeError(
        f"The model_fn returned {type(spec).__name__} ({spec!r:.80}); "
        "expected a tf.estimator.EstimatorSpec. Return one for every mode.")
  if mode in (ModeKeys.TRAIN, ModeKeys.EVAL) and spec.loss is None:
    raise ValueError(
        f"The model_fn returned an EstimatorSpec without a loss in {mode} "
        "mode; `multi_gpu` needs each tower's loss to combine them.")
  return spec


def is_export_graph(features: Any, mode: str) -> bool:
  """Whether this graph is a SavedModel's (see the module docstring)."""
  return _called_by_export() or (
      mode == ModeKeys.PREDICT and _is_fed(features))


def _called_by_export() -> bool:
  """Whether `Estimator._add_meta_graph_for_mode` is on the call stack
  (its code object: a subclass overriding it calls it)."""
  code = compat.private(tf.estimator.Estimator,
                        "_add_meta_graph_for_mode").__code__
  frame = inspect.currentframe()
  while frame is not None:
    if frame.f_code is code:
      return True
    frame = frame.f_back
  return False


def _is_fed(features: Any) -> bool:
  """Whether a Placeholder is among the features and the ops they read."""
  leaves = [leaf.op for leaf in tf.nest.flatten(features,
                                                expand_composites=True)
            if isinstance(leaf, tf.Tensor)]
  return any(current.type in dataflow.PLACEHOLDERS
             for current in dataflow.walk(leaves, control=True))
