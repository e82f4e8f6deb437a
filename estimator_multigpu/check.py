"""`check_towers`: prove on your own model_fn that N towers train like one.

`check_towers(model_fn, input_fn, devices)` trains the unwrapped model_fn on
one device and `multi_gpu(model_fn, devices=...)` on the towers, from the same
initial values on the same global batches, compares every variable both
graphs share (weights, moving statistics, optimizer slots, `global_step`) and
explains a mismatch: it finds per-tower gradient transforms in the graph,
and retries with `sync_batch_norm=True` and with `loss_reduction="sum"` to
see whether one of them makes the towers exact.

Random numbers drawn while training (dropout) differ by construction: each
tower draws its own, the same in distribution as one device's draw but not
bit for bit. During the check they are held at a fixed value (a uniform
draw is 0.5, a normal one 0: dropout keeps every unit), in both runs, so the
comparison is exact; initializers keep their randomness (the towers start
from the one device's initial values anyway).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Any, Callable, Optional

from absl import logging
import numpy as np
import tensorflow as tf

from estimator_multigpu import check_readouts
from estimator_multigpu import compat
from estimator_multigpu import devices as devices_lib
from estimator_multigpu import decorator
from estimator_multigpu.graph import calling
from estimator_multigpu.graph import plan as plan_lib
from estimator_multigpu.graph import state_updates
from estimator_multigpu.update import clipping

op_callbacks = compat.internal("op_callbacks")
function_utils = compat.internal("function_utils")
tf1 = tf.compat.v1
TRAIN = tf.estimator.ModeKeys.TRAIN

_COUPLED = (
    "the loss divides by a count of the batch (valid tokens, matched "
    "anchors, params['batch_size']) or lets examples see each other "
    "(in-batch negatives, contrastive losses, a global top-k), so each "
    "tower computes it on its shard alone",
    "divide with emg.global_ratio(numerator, count) instead of '/', and "
    "gather what examples share with emg.cross_tower_concat (docs/losses.md: "
    "'Losses over the global batch')")
_GRADIENTS = (
    "the first-step loss agrees but the updates differ: the gradients are "
    "changed per tower (a transform, a random op seeded per tower) before "
    "they are applied",
    "apply TowerOptimizer.compute_gradients' output unchanged; clip with "
    "multi_gpu(clip_gradients_by_norm=...)")


@dataclasses.dataclass
class _Run:
  """One training run: variables before and after, its first loss."""
  initial: dict
  final: dict
  first_loss: float
  transformed: list
  readouts: dict = dataclasses.field(default_factory=dict)
  noisy: list = dataclasses.field(default_factory=list)
  state: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TowerCheck:
  """What `check_towers` found.

  Attributes:
    ok: every shared variable, and everything the user reads, agrees
      within the tolerance.
    worst: (name, max abs difference), largest first; a name is a
      variable, `eval/<metric>`, `predict/<key>`, `summary/<tag>` or
      `hook/<Hook>.<key>` (`check_readouts`); one the one device has and
      the towers lack (or hold in another shape) counts as inf.
    devices: the towers' devices.
    steps: training steps compared.
    loss_one_device, loss_towers: the first step's loss of each.
    causes: (likely cause, fix) pairs when not `ok`.
  """
  ok: bool
  worst: list
  devices: list
  steps: int
  loss_one_device: float
  loss_towers: float
  causes: list = dataclasses.field(default_factory=list)

  def __str__(self) -> str:
    where = (f"{len(self.devices)} towers ({', '.join(self.devices)}), "
             f"{self.steps} step{'s' if self.steps > 1 else ''}")
    largest = ", ".join(f"{name} {diff:.2g}" for name, diff in self.worst[:3])
    if self.ok:
      return (f"check_towers: OK: {where}: {len(self.worst)} variables and "
              f"readouts match one device (largest differences: {largest or 'none'}).")
    lines = [f"check_towers: MISMATCH: {where}: the towers differ from one "
             f"device (largest differences: {largest}); first-step loss "
             f"{self.loss_one_device:.6g} on one device, "
             f"{self.loss_towers:.6g} on the towers."]
    lines += [f"Likely cause: {cause}. Fix: {fix}." for cause, fix in
              self.causes]
    return "\n".join(lines)


def check_towers(model_fn: Callable[..., Any], input_fn: Callable[..., Any],
                 devices: plan_lib.DevicesOption, steps: int = 1,
                 params: Optional[dict] = None, *, tolerance: float = 1e-5,
                 modes: tuple = ("eval", "predict"),
                 **multi_gpu_options: Any) -> TowerCheck:
  """Trains `model_fn` unwrapped and on `devices`; compares the variables
  and what the user reads (summaries, hooks' scalars, `modes`' outputs).

  Args:
    model_fn: the unwrapped model_fn (TRAIN mode is built).
    input_fn: `() -> Dataset | (features, labels)` (or taking `params`), as
      for Estimator; called once per run, so it must yield the same batches
      each time (seed any shuffle).
    devices: as `multi_gpu(devices=...)`. CPU devices are virtual: the check
      makes a session with enough of them.
    steps: training steps to compare.
    params: passed to the model_fn and input_fn.
    tolerance: largest difference allowed, relative to the variable's
      magnitude when that exceeds 1.
    modes: besides TRAIN, which of "eval" (eval_metric_ops) and "predict"
      (predictions) to compare, from one device's trained variables; each
      costs two more graphs and `steps` batches (`check_readouts`).
    **multi_gpu_options: more `multi_gpu` options (e.g. sync_batch_norm).

  Returns:
    A `TowerCheck`; `str()` of it explains a mismatch.
  """
  groups = plan_lib.resolve_groups(devices) or [[devices_lib.resolve_devices(
      None)[0]]]
  config = _session_config([d for group in groups for d in group])
  run = lambda fn, initial=None, k=1: _train(  # noqa: E731
      fn, input_fn, steps, params, config, initial, k)
  reference = run(model_fn, k=multi_gpu_options.get("accumulate_steps", 1))
  wrapped = decorator.multi_gpu(model_fn, devices=devices, **multi_gpu_options)
  towers = run(wrapped, reference.initial)
  for mode in modes:
    _read_mode(mode, (model_fn, reference), (wrapped, towers), input_fn,
               params, config, steps)
  expected = dict(reference.final, **reference.readouts)
  worst = _differences(expected, dict(towers.final, **towers.readouts))
  check = TowerCheck(_within(worst, expected, tolerance) and
                     not towers.noisy, worst,
                     [devices_lib.short_name(g[0]) for g in groups], steps,
                     reference.first_loss, towers.first_loss)
  if not check.ok:
    def exact_with(**change) -> bool:
      retried = run(decorator.multi_gpu(
          model_fn, devices=devices, **dict(multi_gpu_options, **change)),
                    reference.initial)
      return _within(_differences(reference.final, retried.final),
                     reference.final, tolerance)
    differing = _beyond(worst, expected, tolerance)
    check.causes = (check_readouts.causes(differing) if not any(
        name in reference.final for name in differing) else
                    _causes(reference, towers, multi_gpu_options, exact_with))
  return check


_MODES = {"eval": tf.estimator.ModeKeys.EVAL,
          "predict": tf.estimator.ModeKeys.PREDICT}


def _read_mode(mode: str, reference: tuple, towers: tuple, input_fn,
               params, config, steps: int) -> None:
  """Adds `mode`'s outputs (`eval/...`, `predict/...`) to the readouts of
  the `(fn, _Run)` pairs, both from one device's trained variables; a
  model_fn that does not build `mode` on one device is not compared in it.

  Raises:
    ValueError: `mode` is not "eval" or "predict".
  """
  if mode not in _MODES:
    raise ValueError(f"`modes` holds {mode!r}; expected 'eval' and/or "
                     "'predict'.")
  def read(fn):
    return check_readouts.mode_readouts(
        fn, _MODES[mode], lambda: _inputs(input_fn, params), params,
        tf.estimator.RunConfig(session_config=config), reference[1].final,
        steps, _fixed_random_scope)
  try:
    expected = read(reference[0])
  except (ValueError, TypeError, AttributeError, KeyError) as error:
    logging.info("check_towers: %s not compared (one device: %s)", mode,
                 error)
    return
  reference[1].readouts.update(expected)
  towers[1].readouts.update(read(towers[0]))


@contextlib.contextmanager
def _fixed_random_scope():
  op_callbacks.add_op_callback(_fixed_random)
  try:
    yield
  finally:
    op_callbacks.remove_op_callback(_fixed_random)


def _beyond(worst: list, reference: dict, tolerance: float) -> list:
  return [name for name, diff in worst
          if not _within([(name, diff)], reference, tolerance)]


def _session_config(devices: list) -> tf1.ConfigProto:
  cpus = [int(d.rsplit(":", 1)[1]) for d in devices if "CPU" in d.upper()]
  return devices_lib.make_session_config(num_cpus=max(cpus, default=0) + 1)


_FIXED_RANDOM = {"RandomUniform": 0.5, "RandomStandardNormal": 0.0,
                 "TruncatedNormal": 0.0}


def _fixed_random(op_type, inputs, attrs, outputs, op_name=None, graph=None):
  """An op callback: a random draw of training becomes a fixed value."""
  del attrs, graph
  if op_type not in _FIXED_RANDOM or "Initializer" in (op_name or ""):
    return None
  with tf.name_scope("fixed_for_check_towers"):
    return [tf.fill(tf.cast(inputs[0], tf.int32),
                    tf.cast(_FIXED_RANDOM[op_type], outputs[0].dtype))]


def _train(fn, input_fn, steps: int, params, config, initial,
           batches: int = 1) -> _Run:
  """Trains `fn` for `steps` in a fresh graph; returns what it saw. Each
  step reads `batches` batches of a Dataset, concatenated (the one-device
  reference of `accumulate_steps`)."""
  op_callbacks.add_op_callback(_fixed_random)
  try:
    return _train_fixed(fn, input_fn, steps, params, config, initial,
                        batches)
  finally:
    op_callbacks.remove_op_callback(_fixed_random)


def _train_fixed(fn, input_fn, steps, params, config, initial,
                 batches) -> _Run:
  with tf.Graph().as_default() as graph:
    tf1.set_random_seed(0)
    tf1.train.get_or_create_global_step()
    features, labels = _inputs(input_fn, params, batches)
    spec = calling.call_model_fn(
        fn, features, labels, TRAIN, params or {},
        tf.estimator.RunConfig(session_config=config))
    variables = tf1.global_variables()
    names = [v.op.name for v in variables]
    hooks = check_readouts.recorded_hooks(
        list(spec.training_hooks) + list(spec.training_chief_hooks))
    summaries = tf1.summary.merge_all()
    start_from = [_StartFrom(variables, initial)] if initial else []
    with tf1.train.SingularMonitoredSession(
        hooks=start_from + hooks, scaffold=spec.scaffold,
        config=config) as session:
      start = dict(zip(names, session.raw_session().run(variables)))
      first_loss, readouts = check_readouts.first_step_readouts(
          spec, hooks, session, summaries)
      losses = [first_loss] + [session.run([spec.loss, spec.train_op])[0]
                               for _ in range(steps - 1)]
      final = dict(zip(names, session.raw_session().run(variables)))
    collected = lambda key: sorted(set(graph.get_collection(key)))  # noqa: E731
    return _Run(start, final, float(losses[0]),
                collected(clipping.TRANSFORMED_COLLECTION), readouts,
                collected(clipping.NOISY_COLLECTION),
                collected(state_updates.STATE_COLLECTION))


def _inputs(input_fn, params, batches: int = 1) -> tuple:
  """(features, labels) from an input_fn returning a Dataset (`batches` of
  its batches, concatenated in order) or tensors."""
  result = (input_fn(params=params or {})
            if "params" in function_utils.fn_args(input_fn) else input_fn())
  if isinstance(result, tf.data.Dataset):
    result = _next_batches(tf1.data.make_one_shot_iterator(result), batches)
  if isinstance(result, tuple) and len(result) == 2:
    return result
  return result, None


def _next_batches(iterator, batches: int):
  """`batches` consecutive elements, concatenated along axis 0."""
  elements = [iterator.get_next()]
  for _ in range(batches - 1):
    with tf.control_dependencies(tf.nest.flatten(elements[-1])):
      elements.append(iterator.get_next())
  if batches == 1:
    return elements[0]
  return tf.nest.map_structure(lambda *parts: tf.concat(parts, 0), *elements)


class _StartFrom(tf1.train.SessionRunHook):
  """Once the session is made (after the model_fn's own Scaffold: its
  `init_fn`, `saver`, `ready_op`, `local_init_op`), the variables start from
  `initial` (one device's values), through their initializers, fed: no new
  ops in the finalized graph."""

  def __init__(self, variables: list, initial: dict):
    self._variables, self._initial = variables, initial

  def after_create_session(self, session, coord):
    del coord
    for variable in self._variables:
      if variable.op.name in self._initial:
        session.run(variable.initializer, {
            variable.initializer.inputs[1]: self._initial[variable.op.name]})


def _differences(reference: dict, towers: dict) -> list:
  """(name, max abs difference) for one device's variables, largest first."""
  worst = [(name, _difference(towers[name], value) if name in towers
            else np.inf) for name, value in reference.items()]
  return sorted(worst, key=lambda pair: -pair[1])


def _difference(got, want) -> float:
  """The max abs difference; for strings and booleans (class names a
  prediction returns), 0 if equal, else inf; inf for another shape."""
  got, want = np.asarray(got), np.asarray(want)
  if got.shape != want.shape:
    return np.inf
  if got.dtype.kind in "OSUb" or want.dtype.kind in "OSUb":
    return 0.0 if np.array_equal(got, want) else np.inf
  return float(np.max(np.abs(got - want), initial=0.0))


def _within(worst: list, reference: dict, tolerance: float) -> bool:
  return all(diff <= tolerance * max(1.0, _magnitude(reference[name]))
             for name, diff in worst)


def _magnitude(value) -> float:
  value = np.asarray(value)
  if value.dtype.kind in "OSUb":  # strings, booleans: compared by equality.
    return 1.0
  return float(np.max(np.abs(value), initial=0.0))


def _causes(reference: _Run, towers: _Run, options: dict, retry) -> list:
  """The likely causes of a mismatch, each with its fix."""
  causes = []
  if towers.transformed:
    causes.append((
        "the model_fn transforms each tower's gradients before applying "
        f"them (clipping {', '.join(_short(towers.transformed))})",
        "remove the clip from the model_fn and pass multi_gpu(..., "
        "clip_gradients_by_norm=<the same norm>)"))
  causes += _structural_causes(towers)
  if not options.get("sync_batch_norm") and retry(sync_batch_norm=True):
    causes.append((
        "batch norm normalizes each tower's shard with its own statistics",
        "pass multi_gpu(..., sync_batch_norm=True)"))
  if (options.get("loss_reduction", "mean") == "mean" and
      retry(loss_reduction="sum")):
    causes.append((
        "the loss is a sum over the tower's examples, not a mean (rule 2)",
        "pass multi_gpu(..., loss_reduction='sum'), or divide the sum with "
        "emg.global_ratio(total, count)"))
  if not causes:
    same_loss = np.isclose(reference.first_loss, towers.first_loss,
                           rtol=1e-5, atol=1e-6)
    causes.append(_GRADIENTS if same_loss else _COUPLED)
  return causes


def _structural_causes(towers: _Run) -> list:
  """Causes found in the towers' graph: per-tower gradient noise, state the
  train_op updates from tower 0's shard."""
  causes = []
  if towers.noisy:
    causes.append((
        "random noise is added to each tower's gradients "
        f"({', '.join(_short(towers.noisy))}), so the combined noise has "
        "less than one device's standard deviation (check_towers holds "
        "random draws fixed, so the values can still agree)",
        "add the noise once, to the combined gradients: an optimizer that "
        "wraps the inner one, inside TowerOptimizer"))
  if towers.state:
    causes.append((
        "the train_op updates state from tower 0's shard only, outside "
        f"UPDATE_OPS ({', '.join(_short(towers.state))}): a statistic of "
        "the batch (moving average, center-loss counts)",
        "compute it over the global batch with emg.cross_tower_sum or "
        "emg.cross_tower_moments, or use a batch-norm layer with "
        "multi_gpu(..., sync_batch_norm=True)"))
  return causes


def _short(names: list) -> list:
  return [re.sub(r"^tower_\d+/", "", name) for name in names[:3]] + (
      ["..."] if len(names) > 3 else [])
