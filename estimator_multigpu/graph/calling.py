"""Calling the user's model_fn: its arguments, its result, and export graphs.

Estimator tells the model_fn the mode but not whether the graph is a
SavedModel's (`Estimator.export_saved_model`), which must hold one tower and
no device placement. The signal used is the graph's own structure:
Estimator's train, evaluate and predict read features from `input_fn`, which
nothing feeds; an export reads them from the serving input receiver's
placeholders. So a PREDICT graph whose features are fed through a
`Placeholder` is built as an export graph: the unwrapped model_fn, once, on
no device. (Calling a wrapped model_fn by hand in PREDICT mode with
placeholder features gives the same one-tower graph and the same numbers.)
TRAIN and EVAL graphs always get their towers, fed or not.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu.graph import dataflow
from estimator_multigpu.graph import global_calls

function_utils = compat.internal("function_utils")


ModeKeys = tf.estimator.ModeKeys


def call_model_fn(model_fn, features, labels, mode, params, config):
  """Calls `model_fn` with the arguments it declares; checks what it returns."""
  accepted = tuple(function_utils.fn_args(model_fn))
  kwargs = {name: value for name, value in
            (("params", params), ("config", config), ("mode", mode))
            if name in accepted}
  spec = model_fn(features, labels, **kwargs) if "labels" in accepted else (
      model_fn(features, **kwargs))
  if hasattr(spec, "as_estimator_spec"):  # TPUEstimatorSpec (Google BERT).
    spec = _host_calls_once(spec).as_estimator_spec()
  if not isinstance(spec, tf.estimator.EstimatorSpec):
    raise TypeError(
        f"The model_fn returned {type(spec).__name__} ({spec!r:.80}); "
        "expected a tf.estimator.EstimatorSpec. Return one for every mode.")
  if mode in (ModeKeys.TRAIN, ModeKeys.EVAL) and spec.loss is None:
    raise ValueError(
        f"The model_fn returned an EstimatorSpec without a loss in {mode} "
        "mode; `multi_gpu` needs each tower's loss to combine them.")
  return spec


def _host_calls_once(spec):
  """A TPUEstimatorSpec whose `eval_metrics` and `host_call` functions are
  called once, on the towers' tensors joined into the global batch's (as a
  TPU joins its cores'): `global_calls`."""
  fields = spec._asdict()  # pylint: disable=protected-access
  for key in ("eval_metrics", "host_call"):
    if fields.get(key) is not None:
      fn, tensors = fields[key]
      fields[key] = (global_calls.wrap(fn, f"TPUEstimatorSpec.{key}"),
                     tensors)
  return type(spec)(**fields)


def is_serving_graph(features: Any, mode: str) -> bool:
  """Whether this PREDICT graph's features are fed (an export's receiver)."""
  if mode != ModeKeys.PREDICT:
    return False
  leaves = [leaf for leaf in tf.nest.flatten(features, expand_composites=True)
            if isinstance(leaf, tf.Tensor)]
  return any(_is_fed(leaf.op) for leaf in leaves)


def _is_fed(op: tf.Operation) -> bool:
  """Whether a Placeholder is among `op` and the ops it reads from."""
  return any(current.type in dataflow.PLACEHOLDERS
             for current in dataflow.walk([op], control=True))
