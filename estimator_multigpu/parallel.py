"""Parallel: call one function on every device, each on a shard of the batch.

`make_parallel` is the tower machinery of `multi_gpu` without the Estimator:
it cuts batched inputs into one contiguous shard per device, calls a graph
function once per device (a tower) with shared variables, and concatenates
the towers' outputs in order. It suits multi-device inference of a trained
model, and any graph code that wants data parallelism without a `model_fn`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu import devices as devices_lib
from estimator_multigpu.graph import empty_shards
from estimator_multigpu.graph import plan as plan_lib
from estimator_multigpu.graph import splitting
from estimator_multigpu.graph import towers as towers_lib
from estimator_multigpu.strategies import shared

nest_lib = compat.internal("nest")
tf1 = tf.compat.v1


def make_parallel(fn: Callable[..., Any],
                  devices: plan_lib.DevicesOption, /, *,
                  session_config: Optional[tf1.ConfigProto] = None,
                  aggregation_device: Optional[str] = None,
                  **batched_inputs: Any) -> Any:
  """Calls `fn` once per device on its shard; returns the joined outputs.

  Every batched input is cut along axis 0 into one contiguous shard per
  device, in order, with sizes that differ by at most one: any global batch
  size works, including one unknown until run time, one not divisible by the
  number of devices and one smaller than it (some shards are then empty, so
  `fn` must accept a batch of 0). `fn(**shard_inputs)` runs under each
  device; the outputs (a tensor or nested dicts/tuples/lists of tensors,
  each with a batch dimension) are concatenated along axis 0. The result
  equals `fn(**batched_inputs)` on one device, and so do gradients taken
  through it; with `tf.compat.v1.gradients(...,
  colocate_gradients_with_ops=True)` (or `tf.gradients`, which always
  colocates) each tower's gradient ops run on its device.

  Shared and per tower, as in `multi_gpu`: variables are created once, by
  tower 0, with exactly the names `fn` gives them on one device, and towers
  1.. reuse them (`tf.compat.v1.get_variable`, tf-slim,
  `tf.compat.v1.layers`, and Keras layers created inside `fn`); towers 1..
  build their ops under the name scope `tower_<i>`. Graph collections keep
  only tower 0's items (UPDATE_OPS, LOSSES, summaries). A Keras model built
  before the call is simply called on every shard; one created outside `fn`
  but not yet built must be built first (`model.build(shape)`). `fn` must not
  train: use `multi_gpu` and `TowerOptimizer` for that.

  Example, predicting with a trained tf-slim net on two GPUs:

    images = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 1])
    probabilities = make_parallel(
        lambda images: tf.nn.softmax(nets.mlp.mlp(images, 10)[0]),
        ["/gpu:0", "/gpu:1"], images=images)
    saver = tf.compat.v1.train.Saver()  # the single-device variable names.
    with tf.compat.v1.Session() as session:
      saver.restore(session, checkpoint_path)
      session.run(probabilities, {images: batch})

  Args:
    fn: called as `fn(**shard_inputs)`; builds graph ops and returns the
      outputs. Give it unbatched arguments with `functools.partial`.
    devices: None (every visible GPU, else one CPU tower), an int n (the
      first n GPUs), device strings (`/gpu:0`, `/GPU:0`, `/device:GPU:0`,
      `/cpu:1`) or device groups, as for `multi_gpu`.
    session_config: the config of the session that will run the graph; the
      devices are checked against it (e.g. `make_session_config(num_cpus=4)`
      provides `/cpu:0`..`/cpu:3`). None: GPUs are checked against the ones
      this process sees, and any `/cpu:k` is taken (the session must have
      it: one made with `make_session_config(num_cpus=k + 1)`).
    aggregation_device: where variables live and outputs are joined. None:
      `/cpu:0` with several devices, else the one device.
    **batched_inputs: tensors, `SparseTensor`s or nested structures of them,
      all with the same size along axis 0 (the names `session_config` and
      `aggregation_device` are taken).

  Returns:
    `fn`'s output structure with every tensor holding the whole batch.

  Raises:
    TypeError, ValueError: malformed or missing devices, no batched inputs,
      inputs that disagree on the batch size, towers that return different
      structures or scalars, or that create different variables.
  """
  plan = plan_lib.make_plan(
      plan_lib.resolve_groups(devices),
      _canonical(aggregation_device),
      session_config, api="make_parallel")
  check_batched_inputs(batched_inputs)
  if plan.num_towers == 1:
    return _call_towers(fn, plan, [batched_inputs], None)[0]
  split = splitting.split_batch(batched_inputs, None, plan.num_towers)
  outputs = _call_towers(fn, plan, [features for features, _ in split.shards],
                        split)
  with tf.device(plan.aggregation_device), tf.name_scope("make_parallel"):
    return concat_outputs(outputs)


def _canonical(device: Optional[str]) -> Optional[str]:
  return None if device is None else devices_lib.canonical_device(device)


def check_batched_inputs(batched_inputs: dict) -> None:
  """Checks, when the graph is built, that every input has one batch size.

  Raises:
    ValueError: no inputs, a scalar input, or two static batch sizes differ
      (sizes unknown until run time are checked when the graph runs).
  """
  if not batched_inputs:
    raise ValueError(
        "`make_parallel` got no batched inputs to split; pass them as "
        "keyword arguments, e.g. make_parallel(fn, devices, images=images).")
  sizes = {}
  for path, leaf in _named_leaves(batched_inputs):
    shape = tf.TensorShape(leaf.shape if isinstance(
        leaf, (tf.Tensor, tf.SparseTensor, tf.Variable)) else np.shape(leaf))
    if shape.rank == 0:
      raise ValueError(
          f"`make_parallel` input `{path}` is a scalar, but every batched "
          "input needs a batch dimension (axis 0) to split. Pass values "
          "shared by all shards to `fn` with functools.partial instead.")
    if shape.rank is not None and shape[0] is not None:
      sizes[path] = shape[0]
  if len(set(sizes.values())) > 1:
    listed = ", ".join(f"`{path}` has {size}" for path, size in sizes.items())
    raise ValueError(
        f"`make_parallel` inputs disagree on the batch size: {listed}. Every "
        "batched input must have the same size along axis 0.")


def _named_leaves(batched_inputs: dict) -> list:
  return [(path, leaf) for name in sorted(batched_inputs)
          for path, leaf in splitting.leaves_with_paths(batched_inputs[name],
                                                        name)
          if leaf is not None]


_KERAS_HINT = (" A Keras layer or model made outside `fn` must be built "
               "before make_parallel (`model.build(input_shape)`).")


def _call_towers(fn, plan: plan_lib.Plan, shards: list, split) -> list:
  """Builds one tower per device with shared variables; returns outputs."""
  towers = towers_lib.build_towers(
      lambda tower, shard: _call_in_tower(fn, tower, shard), plan, shards,
      shared.SharedVariables(plan), api="make_parallel",
      hint=_KERAS_HINT,
      tower_scopes=[empty_shards.scope_factory(split)] if split else [])
  return [tower.output for tower in towers]


def _call_in_tower(fn, tower: towers_lib.Tower, shard_inputs: dict) -> Any:
  output = fn(**shard_inputs)
  if tower.optimizer_calls:
    raise ValueError(
        "`fn` applied a `TowerOptimizer` inside `make_parallel`, which "
        "does not train; use the `multi_gpu` decorator to train on several "
        "devices.")
  return output


def concat_outputs(outputs: list) -> Any:
  """Joins the towers' outputs (same nested structure) along axis 0.

  Args:
    outputs: per tower, a tensor or nested dicts/tuples/lists of tensors.

  Returns:
    The structure of `outputs[0]`, each tensor concatenated in tower order.

  Raises:
    TypeError: a leaf is not a dense tensor.
    ValueError: the towers' structures differ, or a tensor is a scalar.
  """
  for index, output in enumerate(outputs[1:], start=1):
    _check_same_structure(outputs[0], output, index)
  paths = [path for path, _ in
           nest_lib.flatten_with_joined_string_paths(outputs[0])]
  leaves = zip(*(tf.nest.flatten(output) for output in outputs))
  joined = [_concat_leaf(path or "<output>", list(pieces))
            for path, pieces in zip(paths, leaves)]
  return tf.nest.pack_sequence_as(outputs[0], joined)


def _check_same_structure(first: Any, other: Any, index: int) -> None:
  try:
    tf.nest.assert_same_structure(first, other)
  except (ValueError, TypeError) as error:
    raise ValueError(
        f"Tower {index} of `make_parallel` returned a different structure "
        f"than tower 0 ({error}). `fn` must return the same structure of "
        "tensors for every shard.") from error


def _concat_leaf(path: str, pieces: list) -> Optional[tf.Tensor]:
  """Concatenates one output across towers; None stays None."""
  if all(piece is None for piece in pieces):
    return None
  if not all(isinstance(piece, tf.Tensor) for piece in pieces):
    kind = next(type(p).__name__ for p in pieces
                if not isinstance(p, tf.Tensor))
    raise TypeError(
        f"`fn` output `{path}` is a {kind}; `make_parallel` concatenates "
        "dense tensors along axis 0. Return a tf.Tensor (e.g. "
        "tf.sparse.to_dense for a SparseTensor).")
  if pieces[0].shape.rank == 0:
    raise ValueError(
        f"`fn` output `{path}` is a scalar; `make_parallel` joins outputs "
        "along their batch dimension (axis 0), so each must have one. Return "
        "per-example values (e.g. the loss before `tf.reduce_mean`).")
  return tf.concat(pieces, axis=0)
