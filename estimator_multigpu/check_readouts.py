"""`check_towers` beyond the variables: what the user reads.

Besides the trained variables, `check_towers` compares, one device against
the towers, under the keys of `TowerCheck.worst`:

- `summary/<tag>`: the user's scalar summaries, and `summary/<hook>/<key>`
  the scalars hooks fetch in a dict, at the first training step;
- `hook/<Hook>.<key>`: the other values training hooks fetch at the first
  step (per-example tensors), as the hook sees them; `<key>` is the dict
  key, the list index or the hook's attribute holding the fetch;
- `eval/<metric>`: every `eval_metric_ops` value after `steps` EVAL batches;
- `predict/<key>`: every prediction of `steps` PREDICT batches.

EVAL and PREDICT start both graphs from one device's trained variables, so a
difference there is the metric's or the prediction's own. Cost: two more
graphs per mode (one device and the towers) and `steps` batches each.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import tensorflow as tf

from estimator_multigpu.graph import calling
from estimator_multigpu.graph import hook_rewrites

tf1 = tf.compat.v1
ModeKeys = tf.estimator.ModeKeys

CAUSES = {
    "eval": ("an eval metric differs: a metric fed a value that couples the "
             "examples of the batch (a statistic of the batch inside a "
             "per-example value), or a batch statistic that is not a mean",
             "see the WARNING `multi_gpu` logs when it builds the EVAL graph; "
             "compute the statistic with emg.cross_tower_sum / "
             "emg.cross_tower_concat, or feed per-example values and weights"),
    "predict": ("a prediction differs: it is computed over the batch (a "
                "softmax over axis 0, batch-normalized scores)",
                "compute it with emg.cross_tower_sum / emg.cross_tower_concat "
                "(docs/losses.md: 'What the user reads')"),
    "summary": ("a summary or hooked scalar differs: a statistic of the "
                "shard that is not a mean or a sum over its examples (a max, "
                "a ratio)", "compute it over the global batch with "
                "emg.cross_tower_sum / emg.global_ratio"),
    "hook": ("a value a training hook fetches differs: a per-example tensor "
             "or statistic `multi_gpu` cannot pair with every tower (built "
             "in tower 0 only, or not a mean or a sum)",
             "see the WARNING `multi_gpu` logs naming the hook; compute it "
             "the same way in every tower, or gather it with "
             "emg.cross_tower_concat / emg.cross_tower_sum"),
}


class HookRecorder(tf1.train.SessionRunHook):
  """Wraps a hook; keeps what it fetched at the first step, as the hook saw
  it: scalars of a dict under `summary/<Hook>/<key>`, the rest under
  `hook/<Hook>.<key>` (the dict key, list index, or the hook's attribute
  holding the fetch)."""

  def __init__(self, hook):
    self._hook, self.values = hook, {}
    self._fetches, self._recorded = None, False

  def begin(self):
    self._hook.begin()

  def after_create_session(self, session, coord):
    self._hook.after_create_session(session, coord)

  def before_run(self, run_context):
    args = self._hook.before_run(run_context)
    if not self._recorded:
      self._fetches = getattr(args, "fetches", None)
    return args

  def after_run(self, run_context, run_values):
    if not self._recorded and self._fetches is not None:
      self._recorded = True
      seen = hook_rewrites.seen_by(self._hook, run_values).results
      self.values = _named_values(self._hook, self._fetches, seen)
    self._hook.after_run(run_context, run_values)

  def end(self, session):
    self._hook.end(session)


def _named_values(hook, fetches, results) -> dict:
  """{readout key: value} of the numbers a hook fetched."""
  name = type(hook).__name__
  if isinstance(results, dict):
    named = {(f"summary/{name}/{key}" if np.ndim(value) == 0 else
              f"hook/{name}.{key}"): value for key, value in results.items()}
  elif isinstance(results, (list, tuple)):
    named = {f"hook/{name}.{i}": value for i, value in enumerate(results)}
  else:
    held = [key for key, value in vars(hook).items() if value is fetches]
    named = {f"hook/{name}.{held[0] if held else 'fetch'}": results}
  return {key: np.asarray(value) for key, value in named.items()
          if _is_number(value)}


def _is_number(value) -> bool:
  return value is not None and np.issubdtype(np.asarray(value).dtype,
                                             np.number)


def recorded_hooks(hooks) -> list:
  """Every hook wrapped in a `HookRecorder`."""
  return [HookRecorder(hook) for hook in hooks]


def summary_values(serialized: bytes) -> dict:
  """{`summary/<tag>`: value} of the scalar summaries in a Summary proto."""
  summary = tf1.Summary.FromString(serialized)
  return {f"summary/{v.tag}": np.asarray(v.simple_value)
          for v in summary.value if v.WhichOneof("value") == "simple_value"}


def first_step_readouts(spec, hooks: list, session, summary_op) -> tuple:
  """Runs the first step; returns (loss, {key: value} of what users read)."""
  fetches = [spec.loss, spec.train_op] + (
      [summary_op] if summary_op is not None else [])
  results = session.run(fetches)
  values = summary_values(results[2]) if summary_op is not None else {}
  for hook in hooks:
    values.update(getattr(hook, "values", {}))
  return results[0], values


def mode_readouts(fn, mode: str, inputs: Callable[[], tuple], params,
                  run_config, variables: dict, steps: int,
                  fixed_random: Callable[[], Any]) -> dict:
  """{`eval/<metric>` or `predict/<key>`: value} of `fn` in `mode`."""
  with fixed_random(), tf.Graph().as_default():
    tf1.set_random_seed(0)
    tf1.train.get_or_create_global_step()
    features, labels = inputs()
    spec = calling.call_model_fn(
        fn, features, labels if mode == ModeKeys.EVAL else None, mode,
        params or {}, run_config)
    with tf1.Session(config=run_config.session_config) as session:
      _start_from(session, variables)
      if mode == ModeKeys.EVAL:
        return _eval_values(session, spec.eval_metric_ops or {}, steps)
      return _predict_values(session, spec.predictions, steps)


def _start_from(session, variables: dict) -> None:
  """The global variables from `variables`, then what a Scaffold's default
  `local_init_op` initializes: local variables (which may copy them) and
  lookup tables."""
  session.run(tf1.global_variables_initializer())
  for variable in tf1.global_variables():
    if variable.op.name in variables:
      variable.load(variables[variable.op.name], session)
  session.run(tf1.train.Scaffold.default_local_init_op())


def _eval_values(session, metric_ops: dict, steps: int) -> dict:
  updates = [update for _, update in metric_ops.values()]
  for _ in range(steps):
    session.run(updates)
  return {f"eval/{name}": np.asarray(session.run(value))
          for name, (value, _) in metric_ops.items()}


def _predict_values(session, predictions, steps: int) -> dict:
  if predictions is None:
    return {}
  if not isinstance(predictions, dict):
    predictions = {"predictions": predictions}
  batches = [session.run(predictions) for _ in range(steps)]
  return {f"predict/{key}": np.concatenate([np.atleast_1d(b[key])
                                            for b in batches])
          for key in predictions}


def causes(differing: list) -> list:
  """(cause, fix) for each kind of readout among the differing keys."""
  kinds = []
  for name in differing:
    kind = name.split("/", 1)[0]
    if kind in CAUSES and kind not in kinds:
      kinds.append(kind)
  return [CAUSES[kind] for kind in kinds]
