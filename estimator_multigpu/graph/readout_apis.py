"""The readout APIs `global_calls` builds once from the global batch.

Metrics: every public function of `tf.compat.v1.metrics` (and the modules
it is defined in), of tf-slim's `metrics` and of TF-Ranking's `metrics`
(when imported) whose first parameter is `labels`, `predictions` or
`values`; and a Keras metric's `update_state` (through Keras's own
`update_state_wrapper`, so every metric class built while towers are built).
Summaries: `tf.compat.v1.summary` and TF2 `tf.summary` scalar, histogram,
image, audio, text (and v1 `tensor_summary`), and `write`, which every TF2
summary (TensorBoard's too) writes through, each in every module that binds
it (`tf.summary`, `tf.compat.v2.summary`: one module on TF 2.15, two from
2.16). A `TPUEstimatorSpec`'s `eval_metrics` and `host_call` functions,
wherever `as_estimator_spec()` is called (in the model_fn, as
tensorflow/tpu's resnet_main.py does, or by `multi_gpu` on the spec it
returns): what they build, whatever API writes it. `tf.math.zero_fraction`
(the canned estimators' `fraction_of_zero_values` summaries) is replaced by
the mean of `value == 0`, without its `tf.cond`, so a summary of it reads as
a mean over the shard's examples. `PATCH` puts the wrapped functions in
place while a tower is built and takes them out after.
"""

from __future__ import annotations

import inspect
import sys

import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu.graph import global_calls
from estimator_multigpu.graph import patching

tf1 = tf.compat.v1

_METRIC_MODULES = ("metrics_impl", "metrics_ops")  # compat.INTERNALS keys.
_OPTIONAL_METRIC_MODULES = ("tf_slim.metrics", "tf_slim.metrics.metric_ops",
                            "tensorflow_ranking.python.metrics")
_METRIC_FIRST_ARGUMENTS = ("labels", "predictions", "values")
_V1_SUMMARIES = ("scalar", "histogram", "image", "audio", "text",
                 "tensor_summary")
_V2_SUMMARIES = ("scalar", "histogram", "image", "audio", "text", "write")

_ORIGINALS: list = []  # (module, name, original function) while installed.
_ZERO_FRACTION_MODULES = (tf.math, tf.nn, tf1.math, tf1.nn)


def zero_fraction(value, name=None) -> tf.Tensor:
  """The fraction of `value`'s elements that are zero (`tf.math.zero_fraction`
  without the `tf.cond` that hides its kind): a mean over the elements."""
  with tf.name_scope(name or "zero_fraction"):
    value = tf.convert_to_tensor(value, name="value")
    zeros = tf.cast(tf.equal(value, tf.zeros([], value.dtype)), tf.float32)
    return tf.reduce_mean(zeros, name="fraction")


def _metric_modules() -> list:
  modules = [tf1.metrics] + [compat.internal(m) for m in _METRIC_MODULES]
  return modules + [sys.modules[m] for m in _OPTIONAL_METRIC_MODULES
                    if m in sys.modules]


def _is_metric(fn) -> bool:
  if not inspect.isfunction(fn) or fn.__name__.startswith("_"):
    return False
  try:
    parameters = list(inspect.signature(fn).parameters)
  except (TypeError, ValueError):
    return False
  return bool(parameters) and parameters[0] in _METRIC_FIRST_ARGUMENTS


def _targets() -> list:
  """(module, attribute name, api name) of every function to wrap."""
  targets = []
  for module in _metric_modules():
    for name, fn in vars(module).items():
      if _is_metric(fn):
        targets.append((module, name, f"{_short(module)}.{name}"))
  summary_v1 = compat.internal("summary_v1")
  for module in (tf1.summary, summary_v1):
    targets += [(module, name, f"tf.compat.v1.summary.{name}")
                for name in _V1_SUMMARIES if hasattr(module, name)]
  modules = {id(m): m for m in (tf.summary, tf.compat.v2.summary)}.values()
  targets += [(module, name, f"tf.summary.{name}") for module in modules
              for name in _V2_SUMMARIES if name in vars(module)]
  return targets


def _short(module) -> str:
  name = module.__name__
  if "tf_slim" in name:
    return "tf_slim.metrics"
  if "ranking" in name:
    return "tfr.metrics"
  return "tf.compat.v1.metrics"


def _install() -> None:
  for module, name, api in _targets():
    original = vars(module)[name]
    _ORIGINALS.append((module, name, original))
    setattr(module, name, global_calls.wrap(original, api))
  for module in _ZERO_FRACTION_MODULES:
    _ORIGINALS.append((module, "zero_fraction", module.zero_fraction))
    module.zero_fraction = zero_fraction
  spec = compat.internal("tpu_estimator").TPUEstimatorSpec
  original_spec = vars(spec)["as_estimator_spec"]
  _ORIGINALS.append((spec, "as_estimator_spec", original_spec))
  spec.as_estimator_spec = lambda tpu_spec: original_spec(
      _host_calls_once(tpu_spec))
  metrics_utils = compat.internal("keras_metrics_utils")
  original = metrics_utils.update_state_wrapper
  _ORIGINALS.append((metrics_utils, "update_state_wrapper", original))
  metrics_utils.update_state_wrapper = lambda update_state_fn: original(
      global_calls.wrap(update_state_fn, _keras_api(update_state_fn),
                        build_in_peers=True))


def _host_calls_once(spec):
  """`spec` (a TPUEstimatorSpec) with its `eval_metrics` and `host_call`
  functions called once, on the towers' tensors joined into the global
  batch's (as a TPU joins its cores'): `global_calls`."""
  fields = spec._asdict()  # pylint: disable=protected-access
  for key in ("eval_metrics", "host_call"):
    if fields.get(key) is not None:
      fn, tensors = fields[key]
      fields[key] = (global_calls.wrap(fn, f"TPUEstimatorSpec.{key}"),
                     tensors)
  return type(spec)(**fields)


def _keras_api(update_state_fn) -> str:
  owner = getattr(update_state_fn, "__self__", None)
  return f"Keras {type(owner).__name__}.update_state"


def _uninstall() -> None:
  while _ORIGINALS:
    module, name, original = _ORIGINALS.pop()
    setattr(module, name, original)


PATCH = patching.Patch(_install, _uninstall)


def scope(tower):
  """A tower scope factory: inside, the wrapped APIs are in place."""
  del tower  # the same for every tower.
  return PATCH.scope()
