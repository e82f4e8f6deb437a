"""Private TensorFlow and Keras modules the package uses, one registry.

Holds `INTERNALS` (key -> `Internal`: the module, the names used in it, what
for) and `internal(key)`, the only way the package imports such a module
(`tensorflow.python.…`, `{keras}.src.…`): it checks every name used is
there, else raises `versions.TensorFlowMoved` with the one line. A test
fails on any other import of a private module (tests/core/test_compat.py);
docs/compatibility.md lists every entry.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import types
from typing import Tuple

from estimator_multigpu.compat import versions


@dataclasses.dataclass(frozen=True)
class Internal:
  """A private TensorFlow/Keras module and the names the package uses in it.

  `module` may name `{keras}`: the Keras 2 package of the installed line
  (`keras` on TF 2.15, `tf_keras` from 2.16).
  """
  module: str
  names: Tuple[str, ...]
  purpose: str


TF_PYTHON = "tensorflow.python."
_TF = TF_PYTHON
INTERNALS = {
    "collective_ops": Internal(
        _TF + "ops.collective_ops", ("all_reduce_v2", "all_gather_v2"),
        "all-reduce and all-gather between towers"),
    "op_callbacks": Internal(
        _TF + "framework.op_callbacks",
        ("add_op_callback", "remove_op_callback"),
        "the package's one op hook (compat.op_hooks)"),
    "gradients_util": Internal(
        _TF + "ops.gradients_util", ("_GradientsHelper",),
        "op hooks leave gradient construction alone (tf.gradients)"),
    "imperative_grad": Internal(
        _TF + "eager.imperative_grad", ("imperative_grad",),
        "op hooks leave gradient construction alone (GradientTape)"),
    "function_utils": Internal(
        _TF + "util.function_utils", ("fn_args",),
        "which arguments a model_fn or input_fn accepts"),
    "func_graph": Internal(_TF + "framework.func_graph", ("FuncGraph",),
                           "empty-shard guards skip function bodies"),
    "util_port": Internal(_TF + "util._pywrap_util_port", ("IsMklEnabled",),
                          "is oneDNN on (empty-shard guards)"),
    "losses_impl": Internal(
        _TF + "ops.losses.losses_impl",
        ("compute_weighted_loss", "_safe_mean"),
        "tf.compat.v1.losses over the global batch"),
    "losses_util": Internal(_TF + "ops.losses.util",
                            ("add_loss", "get_regularization_losses"),
                            "tf.compat.v1.losses over the global batch"),
    "checkpoint_utils": Internal(
        _TF + "training.checkpoint_utils", ("_init_from_checkpoint",),
        "init_from_checkpoint restores in tower 0, as on one device"),
    "variable_scope": Internal(
        _TF + "ops.variable_scope",
        ("_get_default_variable_store", "get_variable_scope_store"),
        "towers reuse tower 0's variables"),
    "nest": Internal(_TF + "util.nest", ("flatten_with_joined_string_paths",),
                     "make_parallel names its inputs"),
    "tensor_util": Internal(
        _TF + "framework.tensor_util",
        ("try_evaluate_constant", "constant_value",
         "constant_value_as_shape"),
        "a count of the shard TensorFlow folded (readouts' ratios); the "
        "global batch's op table reads constant arguments"),
    "tensor": Internal(_TF + "framework.tensor", ("Tensor",),
                       "fast tf-slim layer builds (tensor equality)"),
    "ref_variable": Internal(_TF + "ops.ref_variable", ("RefVariable",),
                             "replicated variables"),
    "variables": Internal(_TF + "ops.variables", ("PartitionedVariable",),
                          "replicated partitioned variables"),
    "resource_variable_ops": Internal(
        _TF + "ops.resource_variable_ops",
        ("ResourceVariable", "is_resource_variable"), "replicated variables"),
    "eager_context": Internal(_TF + "eager.context", ("context",),
                              "which GPUs TensorFlow sees"),
    "device_lib": Internal(_TF + "client.device_lib",
                           ("list_local_devices",), "device discovery"),
    "keras_batch_norm": Internal(
        "{keras}.src.layers.normalization.batch_normalization",
        ("BatchNormalizationBase",), "synchronized batch norm (Keras layers)"),
    "metrics_impl": Internal(
        _TF + "ops.metrics_impl", ("mean", "accuracy", "mean_iou"),
        "tf.compat.v1.metrics built once from the global batch"),
    "metrics_ops": Internal(
        _TF + "ops.metrics", ("mean", "accuracy"),
        "tf.compat.v1.metrics built once from the global batch (tf-slim)"),
    "summary_v1": Internal(
        _TF + "summary.summary", ("scalar", "histogram"),
        "summaries built once from the global batch"),
    "keras_metrics_utils": Internal(
        "{keras}.src.utils.metrics_utils", ("update_state_wrapper",),
        "Keras metrics built once from the global batch"),
    "keras_base_layer": Internal(
        "{keras}.src.engine.base_layer", ("Layer",),
        "regularization counted once (loss_reduction='sum')"),
    "keras_base_layer_v1": Internal(
        "{keras}.src.engine.base_layer_v1", ("Layer",),
        "regularization counted once (graph-mode Keras layers)"),
    "keras_v1_layers": Internal(
        "{keras}.api._v1.keras.__internal__.legacy.layers",
        ("BatchNormalization", "batch_normalization"),
        "tf-slim batch norm when tf.compat.v1.layers cannot import"),
    "canned_optimizers": Internal(
        "tensorflow_estimator.python.estimator.canned.optimizers",
        ("get_optimizer_instance", "get_optimizer_instance_v2"),
        "canned estimators' own optimizers on several towers"),
    "tpu_estimator": Internal(
        "tensorflow_estimator.python.estimator.tpu.tpu_estimator",
        ("TPUEstimatorSpec",),
        "host_call / eval_metrics on the global batch (its public name "
        "warns as deprecated inside Estimator scripts)"),
    # Where tf-slim 1.1.0's TensorFlow names live now (slim_compat.MOVED).
    "slim_indexed_slices": Internal(_TF + "framework.indexed_slices",
                                    ("IndexedSlices",), "tf-slim names"),
    "slim_array_ops_stack": Internal(_TF + "ops.array_ops_stack",
                                     ("stack", "unstack"), "tf-slim names"),
    "slim_cond": Internal(_TF + "ops.cond", ("cond",), "tf-slim names"),
    "slim_case": Internal(_TF + "ops.control_flow_case", ("case",),
                          "tf-slim names"),
    "slim_while_loop": Internal(_TF + "ops.while_loop", ("while_loop",),
                                "tf-slim names"),
    "slim_assert": Internal(_TF + "ops.control_flow_assert", ("Assert",),
                            "tf-slim names"),
    "slim_variable_v1": Internal(_TF + "ops.variable_v1", ("VariableV1",),
                                 "tf-slim names"),
    # What the TF >= 2.16 shim edits.
    "tf_export": Internal(_TF + "util.tf_export",
                          ("API_ATTRS", "API_ATTRS_V1", "_Attributes"),
                          "tf.estimator on TF >= 2.16 (export names)"),
    "keras_loader": Internal(_TF + "util.lazy_loader", ("KerasLazyLoader",),
                             "tf.keras routed to tf-keras on TF >= 2.16"),
}


def module_name(key: str) -> str:
  """The module `INTERNALS[key]` names, on the installed Keras line."""
  return INTERNALS[key].module.format(keras=versions.keras_package())


@functools.lru_cache(maxsize=None)
def internal(key: str) -> types.ModuleType:
  """The module of `INTERNALS[key]`, checked to hold every name used.

  Raises:
    TensorFlowMoved: The module or one of its names is gone.
  """
  entry, name = INTERNALS[key], module_name(key)
  try:
    module = importlib.import_module(name)
  except ImportError:
    raise _moved(f"module {name}", entry, name) from None
  for attribute in entry.names:
    if not hasattr(module, attribute):
      raise _moved(f"{name}.{attribute}", entry, name)
  return module


def _moved(what: str, entry: Internal, name: str) -> versions.TensorFlowMoved:
  return versions.TensorFlowMoved(
      versions.moved_message(what, entry.purpose), name=name)
