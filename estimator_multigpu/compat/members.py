"""Private members of TensorFlow and Keras classes the package uses.

Holds `PRIVATE_MEMBERS` (owner, member, what for) and the two accessors
that are the package's only way to read or write such a member:
`private(obj, name)` and `set_private(obj, name, value)`. When a future
TensorFlow renames one, the user gets `versions.TensorFlowMoved`'s one line
naming it, not an `AttributeError` deep in a trace. A name that is not
registered is refused (a bug in the package, caught by its tests);
tests/core/test_compat.py checks each member exists on the installed line
and scans the sources for any private access that bypasses this module.

An owner is a public TensorFlow name (`tf.Operation`) or an `INTERNALS`
key and a class in that module (`keras_batch_norm.BatchNormalizationBase`).
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple, Tuple

from estimator_multigpu.compat import internals
from estimator_multigpu.compat import versions


class PrivateMember(NamedTuple):
  """A private member of a TensorFlow/Keras class, and what the package
  uses it for (`since`: the first line that has it and needs it)."""
  owner: str
  member: str
  purpose: str
  since: Tuple[int, int] = versions.FIRST_SUPPORTED


_SAVER = "tf.compat.v1.train.Saver"
_SAVER_SETTINGS = "a model's own Saver rebuilt with the variables it lacks"
_OPTIMIZER_STATE = "a fresh optimizer per tower (replicated variables)"
_RUN_CONFIG = "RunConfig without the distribute coordinator (TF >= 2.16)"
_BATCH_NORM = "keras_batch_norm.BatchNormalizationBase"

PRIVATE_MEMBERS = (
    PrivateMember("tf.Operation", "_add_control_inputs",
                  "metric updates in tower order; replicated copies after "
                  "the broadcast"),
    PrivateMember("tf.Operation", "_update_input",
                  "metric updates and summaries read the global batch's "
                  "value"),
    PrivateMember("tf.Tensor", "_USE_EQUALITY", "fast tf-slim layer builds"),
    PrivateMember("tf.Graph", "_create_op_internal",
                  "empty-shard guards (an op rebuilt inside a cond)"),
    PrivateMember("tf.Graph", "_get_function",
                  "variable writes inside function bodies"),
    PrivateMember(_BATCH_NORM, "_moments",
                  "synchronized batch norm (Keras layers)"),
    PrivateMember(_BATCH_NORM, "_fused_batch_norm",
                  "synchronized batch norm (fused Keras layers)"),
    PrivateMember(_BATCH_NORM, "_assign_moving_average",
                  "a layer's own moving statistics kept as its warning says"),
    PrivateMember("keras_base_layer.Layer", "_handle_weight_regularization",
                  "regularization counted once (loss_reduction='sum')"),
    PrivateMember("keras_base_layer_v1.Layer",
                  "_handle_weight_regularization",
                  "regularization counted once (graph-mode Keras layers)"),
    PrivateMember(_SAVER, "_is_built", _SAVER_SETTINGS),
    PrivateMember(_SAVER, "_var_list", _SAVER_SETTINGS),
    *(PrivateMember(_SAVER, "_" + setting, _SAVER_SETTINGS) for setting in (
        "reshape", "sharded", "max_to_keep", "keep_checkpoint_every_n_hours",
        "restore_sequentially", "allow_empty", "write_version",
        "pad_step_number", "save_relative_paths", "filename")),
    *(PrivateMember("tf.compat.v1.train.Optimizer", state, _OPTIMIZER_STATE)
      for state in ("_slots", "_non_slot_dict",
                    "_deferred_slot_restorations")),
    PrivateMember("resource_variable_ops.ResourceVariable", "_handle_name",
                  "a tower's copy is named as tower 0's variable"),
    PrivateMember("resource_variable_ops.ResourceVariable", "_shared_name",
                  "a tower's copy names its slots after its op (overridden)"),
    PrivateMember("tf.Variable", "_set_save_slice_info",
                  "replicated partitioned variables"),
    PrivateMember("tf.Variable", "_get_save_slice_info",
                  "replicated partitioned variables"),
    PrivateMember("variables.PartitionedVariable", "_get_partitions",
                  "replicated partitioned variables"),
    PrivateMember("variable_scope._VariableStore", "_vars",
                  "towers 1.. create no variables of their own"),
    PrivateMember("tf.compat.v1.mixed_precision.DynamicLossScale", "_weights",
                  "the loss scale's variables are local (not checkpointed)"),
    PrivateMember("tf.estimator.Estimator", "_add_meta_graph_for_mode",
                  "export graphs (any mode) are the one-tower model_fn"),
    PrivateMember("tf.estimator.Estimator", "_session_config",
                  "an all-reduce job's sessions see the group's devices"),
    PrivateMember("eager_context.Context", "_context_handle",
                  "whether this process's GPUs can still change"),
    PrivateMember("eager_context.Context", "_physical_devices",
                  "whether this process's GPUs can still change"),
    PrivateMember("tf.keras.optimizers.legacy.Optimizer", "_name",
                  "Keras optimizers' gradients in towers"),
    PrivateMember("tf.keras.optimizers.legacy.Optimizer", "_iterations",
                  "canned estimators given one Keras optimizer"),
    *(PrivateMember("tf.estimator.RunConfig", name, _RUN_CONFIG) for name in (
        "_experimental_distribute", "_train_distribute", "_eval_distribute",
        "_init_distributed_setting_from_environment_var",
        "_maybe_overwrite_session_config_for_distributed_training")),
    PrivateMember("keras_loader.KerasLazyLoader", "_tfll_keras_version",
                  "tf.keras already loaded as Keras 3 is refused", (2, 16)),
)

_BY_NAME: dict = {}
for _entry in PRIVATE_MEMBERS:
  _BY_NAME.setdefault(_entry.member, []).append(_entry)
del _entry

_REQUIRED = object()


def private(obj: Any, name: str, default: Any = _REQUIRED, *,
            own: bool = False) -> Any:
  """`obj.<name>`, a private member registered in `PRIVATE_MEMBERS`.

  Args:
    obj: the TensorFlow or Keras object (or class) that holds it.
    name: the member, e.g. "_add_control_inputs".
    default: returned when `obj` has no such member (a defensive read);
      without it, a missing member is `TensorFlowMoved`.
    own: only a member `obj` holds itself (`vars(obj)`), none it inherits
      or computes (a lazy loader's `__getattr__`).

  Raises:
    TensorFlowMoved: `obj` has no `name` (and no `default` was given).
    LookupError: `name` is not in `PRIVATE_MEMBERS`.
  """
  if name not in _BY_NAME:
    raise LookupError(f"compat.private: {name!r} is not in "
                      "compat.PRIVATE_MEMBERS; register it (owner, member, "
                      "purpose) before using it.")
  value = vars(obj).get(name, _REQUIRED) if own else getattr(
      obj, name, _REQUIRED)
  if value is not _REQUIRED:
    return value
  if default is not _REQUIRED:
    return default
  raise _moved(obj, name)


def set_private(obj: Any, name: str, value: Any) -> None:
  """Sets `obj.<name>`, a registered private member `obj` already has.

  Raises:
    TensorFlowMoved: `obj` has no `name` (setting a renamed member would
      silently do nothing).
    LookupError: `name` is not in `PRIVATE_MEMBERS`.
  """
  private(obj, name)
  setattr(obj, name, value)


def owner_class(owner: str) -> type:
  """The class (or object) an owner string names, e.g. "tf.Operation"."""
  root, _, path = owner.partition(".")
  value = (importlib.import_module("tensorflow") if root == "tf" else
           internals.internal(root))
  for part in path.split("."):
    value = getattr(value, part)
  return value


def owner_text(owner: str) -> str:
  """The owner's full name for a message (an internal's module spelled out)."""
  root, _, path = owner.partition(".")
  return owner if root == "tf" else f"{internals.module_name(root)}.{path}"


def _moved(obj: Any, name: str) -> versions.TensorFlowMoved:
  """The one line for `name` gone from `obj`, naming the nearest owner."""
  entry = min(_BY_NAME[name], key=lambda e: _distance(e.owner, obj))
  return versions.TensorFlowMoved(versions.moved_message(
      f"{owner_text(entry.owner)}.{name}", entry.purpose))


def _distance(owner: str, obj: Any) -> int:
  """How far up `obj`'s class hierarchy `owner` is (large: not there)."""
  mro = (obj if isinstance(obj, type) else type(obj)).__mro__
  try:
    cls = owner_class(owner)
  except (ImportError, AttributeError):
    return len(mro)
  return mro.index(cls) if cls in mro else len(mro)
