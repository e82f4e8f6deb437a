"""Empty shards on CPU towers: keep oneDNN's kernels away from 0-example batches.

A global batch smaller than the number of towers leaves some shards empty
(a batch of 1 on 2 towers; an evaluation's short last batch). TensorFlow
2.15's oneDNN kernels, on by default on x86 CPUs, mishandle a batch of 0:
`Conv2D` returns its input unchanged (wrong shape, so the next layer fails
with "input depth must be evenly divisible by filter depth"), `Conv2D` +
`BiasAdd` and depthwise convolutions fail, and `MaxPool`'s gradient aborts
the process. GPU kernels handle empty batches correctly.

So in a tower that runs on a CPU, whose shard can be empty (statically
empty, or of a size known only at run time, for towers 1..), with oneDNN
enabled, each op of `dataflow.EMPTY_BATCH_UNSAFE` the model_fn creates is
built inside `tf.cond(batch > 0, op, empty result)`: the op never runs on an
empty batch and an empty shard yields an empty result of the right shape, so
the numbers are one device's. Its gradient goes through the cond. Towers on GPUs, tower
0 (which always has an example) and shards known to be non-empty get nothing.
"""

from __future__ import annotations

import contextlib
import threading

import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu.compat import op_hooks
from estimator_multigpu.graph import dataflow

func_graph = compat.internal("func_graph")
_pywrap_util_port = compat.internal("util_port")


tf1 = tf.compat.v1

_STATE = threading.local()


def scope_factory(split):
  """The towers' scope: `guarded_ops` where a tower needs it."""
  def scope(tower):
    if needs_guard(tower, split.may_be_empty(tower.index)):
      return guarded_ops()
    return contextlib.nullcontext()
  return scope


def needs_guard(tower, may_be_empty: bool) -> bool:
  """Whether `tower` must keep `dataflow.EMPTY_BATCH_UNSAFE` away from an
  empty batch."""
  device = tower.device or ""
  return (may_be_empty and "GPU" not in device.upper() and
          _pywrap_util_port.IsMklEnabled())


@contextlib.contextmanager
def guarded_ops():
  """Builds each `dataflow.EMPTY_BATCH_UNSAFE` op created inside so it skips
  empty batches."""
  with op_hooks.installed("empty_shards", _guard):
    yield


def _guard(op_type, inputs, attrs, outputs, op_name=None, graph=None):
  """An op callback: the op again, inside `tf.cond(batch > 0, ...)`."""
  del op_name
  if (op_type not in dataflow.EMPTY_BATCH_UNSAFE or
      outputs[0].op is not op_hooks.original_op() or  # replaced already.
      getattr(_STATE, "inside", False) or
      isinstance(graph, func_graph.FuncGraph) or not inputs or
      not outputs or  # None when the op is not built yet (Keras Conv2D).
      any(output.shape.rank is None for output in outputs)):
    return None
  attributes = {attrs[i]: attrs[i + 1] for i in range(0, len(attrs), 2)}
  dtypes = [output.dtype for output in outputs]

  def compute():
    _STATE.inside = True
    try:
      op = compat.private(tf1.get_default_graph(), "_create_op_internal")(
          op_type, list(inputs), dtypes=dtypes, attrs=attributes)
      return list(op.outputs)
    finally:
      _STATE.inside = False

  def empty():
    return [tf.zeros([0] + [d or 0 for d in output.shape.as_list()[1:]],
                     output.dtype) for output in outputs]

  return tf.cond(tf.shape(inputs[0])[0] > 0, compute, empty,
                 name=f"{op_type}_unless_empty")
