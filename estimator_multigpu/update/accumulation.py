"""Gradient accumulation: k input batches, one update (`accumulate_steps=k`).

One training step of a model_fn wrapped with `multi_gpu(accumulate_steps=k)`
reads k consecutive batches from `input_fn` (micro-batches), runs each through
the towers, and applies one update equal to the single-device update on their
concatenation. With micro-batch j's combined gradient Gⱼ and loss Lⱼ (a mean
over its nⱼ examples for `loss_reduction="mean"`, a sum for "sum"):

    "mean":  G = Σⱼ nⱼ·Gⱼ / Σⱼ nⱼ     L = Σⱼ nⱼ·Lⱼ / Σⱼ nⱼ
    "sum":   G = Σⱼ Gⱼ                L = Σⱼ Lⱼ

The total count is only known after the k-th micro-batch, so the accumulators
hold the unnormalized sums and the division happens when the update is applied:
uneven micro-batches (a short last batch) weigh exactly by their examples.

How one step runs: `AccumulationHook`, which the wrapper adds to the spec's
training hooks (so `Estimator.train` always runs it), first runs the
*accumulate* op k-1 times; each reads one batch and adds nⱼ·Gⱼ, nⱼ·Lⱼ and nⱼ
into local variables on the aggregation device (`gradient_accumulation/...`,
not checkpointed, so checkpoints stay portable across `accumulate_steps`).
Then Estimator's own `session.run` of the train_op reads the k-th batch,
applies (accumulated + current) / total with the wrapped optimizer, and zeroes
the accumulators. Every Estimator step is therefore one update: `global_step`,
learning-rate schedules, checkpoints, summaries, step logging and the EMA
(`ema_decay`) count updates, and `Estimator.train(steps=1)` consumes k batches.

Sparse gradients (`IndexedSlices`) stay sparse: they are added into a dense
accumulator by `scatter_add` (memory: one copy of the variable, like an
optimizer slot) that remembers which rows were touched, and the update is
applied as `IndexedSlices` over exactly those rows, as the concatenated batch's
sparse gradient would be (duplicate rows summed).

Batch-norm UPDATE_OPS (tower 0's) run with every micro-batch, as in Horovod's
`backward_passes_per_step` and other accumulation implementations: moving
statistics get k updates per step, each from one micro-batch. Batch statistics
inside the forward pass are per tower and per micro-batch, so a network with
batch norm is not bit-equal to the big batch (nothing short of keeping all k
micro-batches' activations could make it so).

An input that ends in the middle of a step drops that partial step (its
micro-batches are not applied), like `drop_remainder`. Running the train_op by
hand without the hook applies each batch on its own (k=1), never a wrongly
scaled update.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from absl import logging
import tensorflow as tf

from estimator_multigpu.cross_tower import losses
from estimator_multigpu.graph import dataflow
from estimator_multigpu.update import chain

tf1 = tf.compat.v1

SCOPE = "gradient_accumulation/"  # absolute name scope of the accumulators.


def check_steps(accumulate_steps: Any) -> int:
  """Validates `accumulate_steps`.

  Raises:
    TypeError: not an int.
    ValueError: less than 1.
  """
  if isinstance(accumulate_steps, bool) or not isinstance(accumulate_steps,
                                                          int):
    raise TypeError(
        f"`accumulate_steps` must be an int; got {accumulate_steps!r} "
        f"({type(accumulate_steps).__name__}). Pass e.g. accumulate_steps=4 "
        "to apply one update per 4 input batches.")
  if accumulate_steps < 1:
    raise ValueError(
        f"`accumulate_steps` is {accumulate_steps}; expected an int >= 1 "
        "(1 = no accumulation, k = one update per k input batches).")
  return accumulate_steps


def _local_variable(name: str, shape, dtype) -> tf.Variable:
  """A zero-initialized local resource variable under `SCOPE`."""
  graph = tf1.get_default_graph()
  with tf.control_dependencies(None), graph.name_scope(SCOPE):
    return tf1.Variable(tf.zeros(shape, dtype), trainable=False,
                        collections=[tf1.GraphKeys.LOCAL_VARIABLES],
                        use_resource=True, name=name)


def micro_batch_weight(tower0, examples: Any, shard: Any) -> Any:
  """What micro-batch j is weighted by: its examples nⱼ, or, for a loss
  normalized by a count of the batch (`global_ratio`, `tf.compat.v1.losses`
  with weights, e.g. a token-level mean), that count over the global
  micro-batch Tⱼ: Σⱼ Tⱼ·(numⱼ/Tⱼ) / Σⱼ Tⱼ is then the normalized loss of the
  whole accumulated batch. A loss that mixes such a term with another term
  of the batch (two normalizers, or a per-example mean) cannot be weighted
  exactly: a WARNING says so and micro-batches are weighed by examples.
  """
  pairs = tower0.collections.get(losses.NORMALIZERS, [])
  if not pairs or tower0.spec.loss is None:
    return examples
  ratios = {ratio.op for ratio, _ in pairs}
  totals = {id(total): total for _, total in pairs}
  inputs = {t.op for t in tf.nest.flatten(shard, expand_composites=True)
            if isinstance(t, tf.Tensor)}
  other = dataflow.ancestors(
      [tower0.spec.loss], control=True, per_output=True,
      stop=lambda op: op in ratios or dataflow.is_collective(op)) & inputs
  if len(totals) > 1 or other:
    logging.warning(
        "multi_gpu: accumulate_steps weighs micro-batches by their examples,"
        " but the loss %s: those terms are weighted per micro-batch, not "
        "normalized over the whole accumulated batch. Use one normalizer "
        "(one global_ratio or tf.compat.v1.losses term) for the batch-"
        "dependent part of the loss, or accumulate_steps=1.",
        "has %d different normalizers" % len(totals) if len(totals) > 1
        else "also has a term that is not normalized by them")
    return examples
  return next(iter(totals.values()))


@dataclasses.dataclass
class Accumulator:
  """Running sums over the micro-batches of one update.

  Attributes:
    steps: k, micro-batches per update.
    weight: this micro-batch's weight wⱼ (nⱼ for "mean", 1 for "sum").
    mean: whether the update divides by Σⱼ wⱼ ("mean") or not ("sum").
  """
  steps: int
  weight: tf.Tensor
  mean: bool
  _accumulate: list = dataclasses.field(default_factory=list)
  _reads: list = dataclasses.field(default_factory=list)
  _variables: list = dataclasses.field(default_factory=list)
  _denominator: Optional[tf.Tensor] = None

  @classmethod
  def create(cls, steps: int, loss_reduction: str,
             micro_batch_size: Any) -> "Accumulator":
    """An accumulator whose micro-batches hold `micro_batch_size` examples
    (an int, or a scalar tensor when only known at run time)."""
    mean = loss_reduction == "mean"
    with tf.name_scope(SCOPE):
      weight = (tf.cast(micro_batch_size, tf.float32) if mean else
                tf.constant(1.0))
    return cls(steps, weight, mean)

  def running_sum(self, name: str, value: tf.Tensor,
                  shape: Optional[list] = None) -> tf.Tensor:
    """Σ over this update's micro-batches of `value`, this one included.

    Earlier micro-batches' values are read from a local variable (of `shape`,
    default `value`'s), which the accumulate op adds `value` to and the
    update zeroes.
    """
    total = _local_variable(name, value.shape if shape is None else shape,
                            value.dtype)
    self._accumulate.append(total.assign_add(value))
    return self._read(total) + value

  def _read(self, variable: tf.Variable) -> tf.Tensor:
    """Reads `variable` for the update; the reset is ordered after the read."""
    read = variable.read_value()
    self._reads.append(read)
    self._variables.append(variable)
    return read

  def denominator(self) -> tf.Tensor:
    """Σⱼ wⱼ for "mean" (the examples of the whole update), 1 for "sum"."""
    if self._denominator is None:
      self._denominator = (self.running_sum("examples", self.weight)
                           if self.mean else tf.constant(1.0))
    return self._denominator

  def loss(self, loss: tf.Tensor) -> tf.Tensor:
    """The whole update's loss, given this micro-batch's (combined) loss."""
    with tf.name_scope(SCOPE):
      weighted = tf.math.multiply_no_nan(tf.cast(loss, tf.float32),
                                         self.weight)
      return self.running_sum("loss", weighted) / self.denominator()

  def gradients(self, grads_and_vars: list) -> list:
    """The whole update's gradients, given this micro-batch's combined ones."""
    denominator = self.denominator()
    totals = []
    for grad, var in grads_and_vars:
      if grad is None:
        totals.append((None, var))
        continue
      with tf.name_scope(SCOPE + var.op.name + "/"):
        if isinstance(grad, tf.IndexedSlices):
          total = self._sparse_total(grad, var, denominator)
        else:
          total = self._dense_total(grad, var, denominator)
      totals.append((total, var))
    return totals

  def _dense_total(self, grad, var, denominator) -> tf.Tensor:
    weighted = tf.math.multiply_no_nan(grad, tf.cast(self.weight, grad.dtype))
    summed = self.running_sum(var.op.name, weighted, _static_shape(var))
    return summed / tf.cast(denominator, grad.dtype)

  def _sparse_total(self, grad: tf.IndexedSlices, var,
                    denominator) -> tf.IndexedSlices:
    values = tf.math.multiply_no_nan(grad.values,
                                     tf.cast(self.weight, grad.values.dtype))
    shape = _static_shape(var)
    summed = _local_variable(var.op.name, shape, values.dtype)
    touched = _local_variable(var.op.name + "_rows", shape[:1], tf.bool)
    rows = tf.IndexedSlices(values, grad.indices)
    self._accumulate += [summed.scatter_add(rows), touched.scatter_update(
        tf.IndexedSlices(tf.ones_like(grad.indices, tf.bool), grad.indices))]
    earlier = tf.cast(tf.reshape(tf.where(self._read(touched)), [-1]),
                      grad.indices.dtype)
    all_values = tf.concat([tf.gather(self._read(summed), earlier), values],
                           axis=0)
    return tf.IndexedSlices(
        all_values / tf.cast(denominator, values.dtype),
        tf.concat([earlier, grad.indices], axis=0), grad.dense_shape)

  def accumulate_op(self, *ops) -> tf.Operation:
    """Runs `ops` and adds this micro-batch into the accumulators."""
    return tf.group(*ops, *self._accumulate, name="accumulate_micro_batch")

  def reset_after(self, train_op: tf.Operation, *reads) -> tf.Operation:
    """Runs `train_op` (the update) and `reads` (such as the update's loss),
    then zeroes the accumulators.

    Each zeroing depends directly on every read: through grouped no-ops
    only, Grappler's dependency optimizer was seen to let a reset run before
    a read when the loss was fetched too.
    """
    with tf.control_dependencies([train_op, *reads, *self._reads]):
      return tf.group(*[v.assign(tf.zeros(v.shape, v.dtype))
                        for v in self._variables],
                      name="apply_accumulated_update")


def _static_shape(var) -> list:
  shape = var.shape
  if not shape.is_fully_defined():
    raise ValueError(
        f"`accumulate_steps` needs variables of known shape to size their "
        f"accumulators; `{var.op.name}` has shape {shape}. Give the variable "
        "a static shape, or use accumulate_steps=1.")
  return shape.as_list()


class Accumulate(chain.UpdateStep):
  """The update chain's accumulate step: + the earlier micro-batches, ÷
  their weight, with running sums on each applier's device; its spec adds
  the update's loss, the accumulate op's hook and the resets."""

  name = "accumulate"

  def __init__(self, steps: int, loss_reduction: str, micro_batch_size: Any,
               device: Optional[str]):
    """k=`steps` micro-batches of `micro_batch_size` examples (int or
    scalar tensor) per update; the loss and the step's own sums (the main
    accumulator) live on the aggregation `device`."""
    self.steps = steps
    self._accumulation = (steps, loss_reduction, micro_batch_size)
    self.device = device
    self._accumulators: dict = {}  # device -> Accumulator.

  def accumulator(self, device: Optional[str]) -> Accumulator:
    """The running sums kept on `device` (made once per device)."""
    if device not in self._accumulators:
      with tf.device(device):
        self._accumulators[device] = Accumulator.create(*self._accumulation)
    return self._accumulators[device]

  def in_every_micro_batch(self, name: str, flag: tf.Tensor) -> tf.Tensor:
    """Whether `flag` holds in every micro-batch of the update (this one
    included), counting those where it failed in the sum `name`."""
    with tf.name_scope(SCOPE):
      failed = self.accumulator(self.device).running_sum(
          name, 1.0 - tf.cast(flag, tf.float32))
    return tf.equal(failed, 0.0)

  def transform(self, update: Any) -> list:
    return self.accumulator(update.device).gradients(update.grads_and_vars)

  def apply_if(self, call: Any) -> None:
    if call.branch is not None:
      raise ValueError(
          "`TowerOptimizer` was called inside a tf.cond branch with "
          f"accumulate_steps={self.steps}: the micro-batches of one update "
          "could take different branches. Use accumulate_steps=1, or call "
          "every optimizer outside the tf.cond.")

  def finish(self, spec, towers: list, output_dir: Optional[str]):
    """The update's loss; the train_op zeroes the sums after it (last)."""
    del output_dir
    with tf.device(self.device):
      main = self.accumulator(self.device)
      loss = main.loss(spec.loss)
      others = [a for d, a in self._accumulators.items() if d != self.device]
      accumulate = tf.group(main.accumulate_op(*towers[0].step_ops()),
                            *[a.accumulate_op() for a in others])
      train_op = spec.train_op
      for accumulator in others:
        train_op = accumulator.reset_after(train_op)
      train_op = main.reset_after(train_op, loss)
    hook = AccumulationHook(accumulate, main.steps)
    return spec._replace(loss=loss, train_op=train_op, training_hooks=list(
        spec.training_hooks) + [hook])


class AccumulationHook(tf1.train.SessionRunHook):
  """Before each training step, runs the accumulate op k-1 times.

  It runs on the raw session, so other hooks (step counters, summaries,
  checkpoints) see one run per update. End of input inside a step ends
  training (OutOfRangeError, as Estimator expects) and drops the partial step.
  """

  def __init__(self, accumulate_op: tf.Operation, steps: int):
    self._accumulate_op = accumulate_op
    self._steps = steps

  def begin(self):
    logging.info("Gradient accumulation: each step runs %d micro-batches "
                 "and applies one update.", self._steps)

  def before_run(self, run_context):
    for _ in range(self._steps - 1):
      run_context.session.run(self._accumulate_op)
