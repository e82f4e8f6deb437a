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
from the one device's initial values anyway). A fixed draw is still a draw
to the towers' graph walks (`dataflow.draws_random`): noise added to each
tower's gradients is not the same in distribution as one device's, so it
is named (`update.clipping.warn_if_noisy`) and the check fails, though the
values agree.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from absl import logging
import tensorflow as tf

from estimator_multigpu import check_readouts
from estimator_multigpu import check_report
from estimator_multigpu import compat
from estimator_multigpu import decorator
from estimator_multigpu import devices as devices_lib
from estimator_multigpu.compat import op_hooks
from estimator_multigpu.graph import calling
from estimator_multigpu.graph import dataflow
from estimator_multigpu.graph import plan as plan_lib
from estimator_multigpu.graph import state_updates
from estimator_multigpu.update import clipping

function_utils = compat.internal("function_utils")
tf1 = tf.compat.v1
TRAIN = tf.estimator.ModeKeys.TRAIN


def check_towers(model_fn: Callable[..., Any], input_fn: Callable[..., Any],
                 devices: plan_lib.DevicesOption, steps: int = 1,
                 params: Optional[dict] = None, *, tolerance: float = 1e-5,
                 modes: tuple = ("eval", "predict"),
                 **multi_gpu_options: Any) -> check_report.TowerCheck:
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
  # Wrapping first: bad options fail before any training, and tf-slim's
  # fixes (`slim_compat`) are in place for the one-device run too.
  wrapped = decorator.multi_gpu(model_fn, devices=devices, **multi_gpu_options)
  reference = run(model_fn, k=multi_gpu_options.get("accumulate_steps", 1))
  towers = run(wrapped, reference.initial)
  for mode in modes:
    _read_mode(mode, (model_fn, reference), (wrapped, towers), input_fn,
               params, config, steps)
  def trained(fn_devices, **change) -> dict:
    return run(decorator.multi_gpu(model_fn, devices=fn_devices, **dict(
        multi_gpu_options, **change)), reference.initial).final

  def exact_with(**change) -> bool:
    return _agree(reference.final, trained(devices, **change), tolerance)

  one_tower: list = []  # one tower accumulating: trained once, if asked.

  def accumulating(**change) -> bool:
    """The towers (with `change`) train like one tower accumulating."""
    one_tower[:] = one_tower or [trained(groups[:1])]
    got = trained(devices, **change) if change else towers.final
    return _agree(one_tower[0], got, tolerance)

  return check_report.compare(
      reference, towers, [devices_lib.short_name(g[0]) for g in groups],
      steps, tolerance, multi_gpu_options, exact_with,
      accumulating if multi_gpu_options.get("accumulate_steps", 1) > 1
      else None)


def _agree(expected: dict, got: dict, tolerance: float) -> bool:
  return check_report.within(check_report.differences(expected, got),
                             expected, tolerance)


_MODES = {"eval": tf.estimator.ModeKeys.EVAL,
          "predict": tf.estimator.ModeKeys.PREDICT}


def _read_mode(mode: str, reference: tuple, towers: tuple, input_fn,
               params, config, steps: int) -> None:
  """Adds `mode`'s outputs (`eval/...`, `predict/...`) to the readouts of
  the `(fn, check_report.Run)` pairs, both from one device's trained
  variables. A model_fn that does not build or run `mode` on one device
  with these inputs (a ranker whose PREDICT graph scores single examples)
  is not compared in it: one device's reason is kept in `not_compared`.

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
  except (ValueError, TypeError, AttributeError, KeyError,
          tf.errors.OpError) as error:
    logging.info("check_towers: %s not compared (one device: %s)", mode,
                 error)
    reference[1].not_compared[mode] = check_report.first_line(error)
    return
  reference[1].readouts.update(expected)
  towers[1].readouts.update(read(towers[0]))


def _fixed_random_scope():
  return op_hooks.installed("fixed_random", _fixed_random)


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
    fixed = tf.fill(tf.cast(inputs[0], tf.int32),
                    tf.cast(_FIXED_RANDOM[op_type], outputs[0].dtype))
  # Still a draw to the graph's walks: per-tower gradient noise is named.
  fixed.graph.add_to_collection(dataflow.FIXED_DRAWS_COLLECTION, fixed.op)
  return [fixed]


def _train(fn, input_fn, steps: int, params, config, initial,
           batches: int = 1) -> check_report.Run:
  """Trains `fn` for `steps` in a fresh graph; returns what it saw. Each
  step reads `batches` batches of a Dataset, concatenated (the one-device
  reference of `accumulate_steps`)."""
  with _fixed_random_scope():
    return _train_fixed(fn, input_fn, steps, params, config, initial,
                        batches)


def _train_fixed(fn, input_fn, steps, params, config, initial,
                 batches) -> check_report.Run:
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
    return check_report.Run(start, final, float(losses[0]),
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


