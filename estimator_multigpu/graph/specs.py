"""Spec merging: one EstimatorSpec out of the towers' specs.

- loss: Σ wᵢ · lossᵢ with wᵢ = nᵢ / n ("mean") or 1 ("sum"); an empty shard's
  loss (NaN for a mean over nothing) adds exactly 0.
- predictions and export outputs: concatenated along axis 0, in tower order,
  which is input order; other axes that differ between towers (decoded ids
  of the shard's longest sequence) are padded to the largest across towers
  (`prediction_padding`, the `prediction_pad_value` option).
- eval metrics: the towers share their metric state variables (see
  `sharing.VariableSharing`), so every tower's update adds into one total; the
  merged metric is tower 0's value with all towers' updates, weighted or
  ordered so it is one device's (`metrics`).
- train_op: tower 0's train_op (whatever the model_fn wrapped around its
  `minimize`, whose no-op waits for that optimizer's combined update) plus
  tower 0's UPDATE_OPS.
- hooks, scaffold: tower 0's; summaries: tower 0's (others never reach the
  SUMMARIES collection).
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from estimator_multigpu.graph import metrics as metrics_lib
from estimator_multigpu.graph import prediction_padding
from estimator_multigpu.graph.global_batch import scopes as global_batch

tf1 = tf.compat.v1
ModeKeys = tf.estimator.ModeKeys

# Graph collections where the merged loss and the towers' losses are
# published (for hooks such as `hooks.NonFiniteLossHook`).
LOSS_COLLECTION = "estimator_multigpu_loss"
TOWER_LOSSES_COLLECTION = "estimator_multigpu_tower_losses"


def publish_losses(loss, tower_losses: list) -> None:
  """Adds the merged loss and the towers' losses to their collections."""
  if loss is not None:
    tf1.add_to_collection(LOSS_COLLECTION, loss)
  for tower_loss in tower_losses:
    tf1.add_to_collection(TOWER_LOSSES_COLLECTION, tower_loss)


def combine_losses(towers: list, weights: Optional[list] = None
                   ) -> tf.Tensor:
  """The weighted sum of the towers' losses (default: their loss weights)."""
  with tf.name_scope("combined_loss"):
    terms = loss_terms(towers, weights)
    return terms[0] if len(terms) == 1 else tf.math.add_n(terms)


def loss_terms(towers: list, weights: Optional[list] = None) -> list:
  """Per tower, its loss times its weight (default: its loss weight)."""
  weights = weights or [tower.loss_weight for tower in towers]
  return [_weighted(tower.spec.loss, weight)
          for tower, weight in zip(towers, weights)]


def check_scalar(loss) -> None:
  """Estimator's check, on a tower's loss: a shard's size is unknown to the
  graph, so a per-example loss of unknown length would pass it (and be
  reshaped to a scalar by `EstimatorSpec`, which fails at run time)."""
  if getattr(loss, "op", None) is not None and loss.op.type == "Reshape" and (
      loss.shape.rank == 0):
    loss = loss.op.inputs[0]
  shape = getattr(loss, "shape", None)
  if shape is not None and shape.rank and shape.num_elements() != 1:
    raise ValueError(
        f"Loss must be scalar, given: {loss}. The model_fn's loss has shape "
        f"{shape}; reduce it (e.g. tf.reduce_mean) before returning it.")


def _weighted(loss: tf.Tensor, weight: Any) -> tf.Tensor:
  if isinstance(weight, float) and weight == 1.0:
    return loss
  return tf.math.multiply_no_nan(loss, tf.cast(weight, loss.dtype))


def concat_predictions(per_tower: list, name: str = "predictions",
                       pad_value: prediction_padding.PadValue = None) -> Any:
  """Concatenates a tensor, or a dict of tensors, along axis 0 (other axes
  padded to the largest across towers with `pad_value`, the
  `prediction_pad_value` option).

  Raises:
    ValueError: a prediction is a scalar (the message names its key).
  """
  if isinstance(per_tower[0], dict):
    _check_same_keys(per_tower, name)
    return {key: _concat([p[key] for p in per_tower], f"{name}[{key!r}]",
                         prediction_padding.pad_value_for(pad_value, key))
            for key in per_tower[0]}
  return _concat(per_tower, name,
                 prediction_padding.pad_value_for(pad_value, None))


def _check_same_keys(per_tower: list, name: str) -> None:
  """Raises naming the first key a tower lacks or adds (vs tower 0)."""
  for index, outputs in enumerate(per_tower[1:], start=1):
    missing = [k for k in per_tower[0] if k not in outputs]
    extra = [k for k in outputs if k not in per_tower[0]]
    if missing or extra:
      key, who = (missing[0], f"tower {index} lacks it") if missing else (
          extra[0], "tower 0 lacks it")
      raise ValueError(
          f"`{name}` key {key!r}: tower 0 and tower {index} return different "
          f"keys ({who}); every tower must return the same `{name}` keys, "
          "unconditionally.")


def _concat(pieces: list, name: str = "predictions", pad_value: Any = None):
  if len(pieces) == 1 or global_batch.is_global(pieces[0]):
    return pieces[0]
  if isinstance(pieces[0], tf.SparseTensor):
    return tf.sparse.concat(axis=0, sp_inputs=pieces)
  if tf.convert_to_tensor(pieces[0]).shape.rank == 0:
    raise ValueError(
        f"The model_fn's `{name}` is a scalar; `multi_gpu` joins the towers' "
        "predictions along their batch dimension (axis 0), so each must have "
        "one, as Estimator.predict expects. Return one value per example "
        "(e.g. shape [batch_size]), or tf.fill([tf.shape(x)[0]], value) for "
        "a value shared by the batch.")
  pieces = [tf.convert_to_tensor(piece) for piece in pieces]
  return tf.concat(prediction_padding.pad_to_largest(pieces, pad_value, name),
                   axis=0)


def merge_export_outputs(per_tower: list,
                         pad_value: prediction_padding.PadValue = None) -> Any:
  """Rebuilds each export output from concatenated tensors."""
  if not per_tower[0]:
    return per_tower[0]
  merged = {}
  for key, first in per_tower[0].items():
    outputs = [outputs[key] for outputs in per_tower]
    merged[key] = _merge_export_output(key, first, outputs, pad_value)
  return merged


def _merge_export_output(key: str, first, outputs: list, pad_value=None):
  export = tf.estimator.export
  if isinstance(first, export.PredictOutput):
    return export.PredictOutput(concat_predictions(
        [o.outputs for o in outputs], f"export_outputs[{key!r}]", pad_value))
  if isinstance(first, export.ClassificationOutput):
    return export.ClassificationOutput(
        _concat_or_none([o.scores for o in outputs]),
        _concat_or_none([o.classes for o in outputs]))
  if isinstance(first, export.RegressionOutput):
    return export.RegressionOutput(_concat([o.value for o in outputs]))
  raise TypeError(
      f"export output `{key}` is a {type(first).__name__}; `multi_gpu` can "
      "merge PredictOutput, ClassificationOutput and RegressionOutput across "
      "towers. Use one of those.")


def _concat_or_none(pieces: list):
  return None if pieces[0] is None else _concat(pieces)


def summarize_tower_losses(towers: list) -> None:
  """One `tower_loss/tower_<i>` summary per tower (the total is Estimator's
  `loss`)."""
  for tower in towers:
    tf1.summary.scalar(f"tower_loss/{tower.name}", tower.spec.loss)


def merged_train_op(towers: list, apply_ops: list) -> tf.Operation:
  """Tower 0's train_op and UPDATE_OPS (`towers.Tower.step_ops`), plus the
  updates no tower-0 op triggers (`update.triggers.tie`)."""
  return tf.group(*towers[0].step_ops(), *apply_ops,
                  name="multi_gpu_train_op")


def merge_specs(towers: list, mode: str, train_op=None, *,
                shares: Optional[list] = None,
                analyses: Optional[list] = None,
                built: frozenset = frozenset(),
                pad_value: prediction_padding.PadValue = None) -> Any:
  """The EstimatorSpec covering the whole global batch.

  Args:
    towers: the built towers.
    mode: the ModeKeys mode.
    train_op: the merged train_op (TRAIN).
    shares: each tower's share of the global batch, nᵢ / n (EVAL metrics).
    analyses: each tower's `tensor_kinds.ShardAnalysis` (EVAL metrics).
    built: the ops readout APIs built once from the global batch
      (`global_calls.Recorder.built_ops`).
    pad_value: the `prediction_pad_value` option (`prediction_padding`).
  """
  first = towers[0].spec
  loss = combine_losses(towers) if first.loss is not None else None
  kwargs = dict(mode=mode, loss=loss, train_op=train_op,
                scaffold=first.scaffold,
                training_chief_hooks=first.training_chief_hooks,
                training_hooks=first.training_hooks,
                evaluation_hooks=first.evaluation_hooks,
                prediction_hooks=first.prediction_hooks)
  if first.predictions is not None and mode != ModeKeys.TRAIN:
    kwargs["predictions"] = concat_predictions(
        [t.spec.predictions for t in towers], pad_value=pad_value)
  if mode == ModeKeys.PREDICT:
    kwargs["export_outputs"] = merge_export_outputs(
        [t.spec.export_outputs for t in towers], pad_value)
  if mode == ModeKeys.EVAL:
    kwargs["eval_metric_ops"] = metrics_lib.merge_eval_metric_ops(
        towers, shares, analyses, built)
  return tf.estimator.EstimatorSpec(**kwargs)
