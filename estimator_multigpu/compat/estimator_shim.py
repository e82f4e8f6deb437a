"""TensorFlow 2.15 through 2.21, and every TensorFlow internal the package uses.

`tf.estimator` left TensorFlow in 2.16; tensorflow-estimator 2.15.0 is its
last release. `install()` runs when `estimator_multigpu` is imported:

* On TF 2.15 it does nothing (it does not even import TensorFlow).
* On TF >= 2.16 it
  1. routes `tf.keras` to Keras 2 (`tf-keras`) by setting
     `TF_USE_LEGACY_KERAS=1`: Keras 3 cannot build layers in a graph-mode
     model_fn. A user's own `TF_USE_LEGACY_KERAS=0`, or a `tf.keras` already
     loaded as Keras 3, is one clear error naming the fix;
  2. gives tensorflow-estimator the five names TF removed (the
     distribute-coordinator module `estimator_training`, which now refuses
     the coordinator's modes; `tf_export.ESTIMATOR_API_NAME` with its
     attribute entries; three TPU-only modules whose names refuse when used);
  3. imports tensorflow-estimator and binds it where TF 2.15 had it:
     `tf.estimator`, `tf.compat.v1.estimator`, `tf.compat.v2.estimator`.

Every private TensorFlow or Keras name the package uses is an entry of
`INTERNALS`, reached through `internal(key)`. When a future TensorFlow moves
one, the user gets one line (`TensorFlowMoved`) naming the TensorFlow
version, what moved and the newest tested version; `docs/compatibility.md`
lists them and `tests/core/test_compat.py` simulates each move.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
import types
from typing import Optional, Tuple

from absl import logging

FIRST_SUPPORTED = (2, 15)
NEWEST_TESTED = (2, 21)
_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu",
                  "tensorflow-intel", "tensorflow-macos", "tensorflow-aarch64",
                  "tensorflow-cpu-aws", "tf-nightly", "tf-nightly-cpu")
_LEGACY_KERAS = "TF_USE_LEGACY_KERAS"
_TRUE = ("true", "True", "1")


class TensorFlowMoved(ImportError):
  """A TensorFlow or Keras internal the package relies on is not there."""


@dataclasses.dataclass(frozen=True)
class Internal:
  """A private TensorFlow/Keras module and the names the package uses in it.

  `module` may name `{keras}`: the Keras 2 package of the installed line
  (`keras` on TF 2.15, `tf_keras` from 2.16).
  """
  module: str
  names: Tuple[str, ...]
  purpose: str


_TF = "tensorflow.python."
INTERNALS = {
    "collective_ops": Internal(
        _TF + "ops.collective_ops", ("all_reduce_v2", "all_gather_v2"),
        "all-reduce and all-gather between towers"),
    "op_callbacks": Internal(
        _TF + "framework.op_callbacks",
        ("add_op_callback", "remove_op_callback"),
        "empty-shard guards; check_towers' fixed random draws"),
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
    "variable_scope": Internal(
        _TF + "ops.variable_scope",
        ("_get_default_variable_store", "get_variable_scope_store"),
        "towers reuse tower 0's variables"),
    "nest": Internal(_TF + "util.nest", ("flatten_with_joined_string_paths",),
                     "make_parallel names its inputs"),
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

# Private members of public TensorFlow classes the package uses (listed in
# docs/compatibility.md; tests/core/test_compat.py checks each exists).
PRIVATE_MEMBERS = (
    ("tf.Operation", "_add_control_inputs",
     "metric updates in tower order; replicated copies after the broadcast"),
    ("tf.Operation", "_update_input",
     "metric updates and summaries read the global batch's value"),
    ("tf.Tensor", "_USE_EQUALITY", "fast tf-slim layer builds"),
)


def tensorflow_version() -> Tuple[int, int]:
  """(major, minor) of the TensorFlow installed (imported if it must be)."""
  if "tensorflow" in sys.modules:
    return _parse(sys.modules["tensorflow"].__version__)
  version = _installed_version()
  if version is None:
    version = _parse(importlib.import_module("tensorflow").__version__)
  return version


def _parse(text: str) -> Tuple[int, int]:
  major, minor = text.split(".")[:2]
  return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def _installed_version() -> Optional[Tuple[int, int]]:
  """The version of the distribution that owns `tensorflow`, from metadata."""
  spec = importlib.util.find_spec("tensorflow")
  if spec is None:
    raise ModuleNotFoundError("No module named 'tensorflow'",
                              name="tensorflow")
  for name in _DISTRIBUTIONS:
    try:
      dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
      continue
    owned = os.path.realpath(str(dist.locate_file("tensorflow/__init__.py")))
    if owned == os.path.realpath(spec.origin or ""):
      return _parse(dist.version)
  return None


def _version_text() -> str:
  return ".".join(map(str, tensorflow_version()))


def keras_package() -> str:
  """The Keras 2 package of the installed line: `keras` or `tf_keras`."""
  return "keras" if tensorflow_version() < (2, 16) else "tf_keras"


def moved_message(what: str, purpose: str) -> str:
  """The one line a user gets when a TensorFlow internal moved."""
  newest = ".".join(map(str, NEWEST_TESTED))
  return (f"estimator_multigpu: TensorFlow {_version_text()} has no {what} "
          f"(used for {purpose}); the newest TensorFlow tested is {newest}. "
          f"Install it (pip install 'tensorflow<{NEWEST_TESTED[0]}."
          f"{NEWEST_TESTED[1] + 1}') or a newer estimator_multigpu.")


@functools.lru_cache(maxsize=None)
def internal(key: str) -> types.ModuleType:
  """The module of `INTERNALS[key]`, checked to hold every name used.

  Raises:
    TensorFlowMoved: The module or one of its names is gone.
  """
  entry = INTERNALS[key]
  name = entry.module.format(keras=keras_package())
  try:
    module = importlib.import_module(name)
  except ImportError:
    raise TensorFlowMoved(moved_message(f"module {name}", entry.purpose),
                          name=name) from None
  for attribute in entry.names:
    if not hasattr(module, attribute):
      raise TensorFlowMoved(
          moved_message(f"{name}.{attribute}", entry.purpose), name=name)
  return module


def install() -> None:
  """Makes the installed TensorFlow line look like 2.15 to the package.

  Raises:
    ModuleNotFoundError: TensorFlow is not installed.
    ImportError: TensorFlow is older than 2.15, Keras cannot be routed to
      tf-keras, or tensorflow-estimator cannot import.
  """
  version = tensorflow_version()
  _check_version(version)
  if version >= (2, 16):
    _route_keras()
    tf = importlib.import_module("tensorflow")
    _check_keras_not_loaded(tf)
    _forget_failed_estimator_import()
    _restore_removed_names()
    _bind_estimator(tf)


def _check_version(version: Tuple[int, int]) -> None:
  """Refuses a TensorFlow older than 2.15; warns on one newer than tested."""
  if version < FIRST_SUPPORTED:
    raise ImportError(
        f"estimator_multigpu needs TensorFlow 2.15 to 2.21; this is "
        f"{_version_text()}. pip install 'tensorflow>=2.15,<2.22'.")
  if version > NEWEST_TESTED:
    logging.warning(
        "estimator_multigpu: TensorFlow %s is newer than the newest tested "
        "(2.%d); an internal that moved will be named in one line.",
        _version_text(), NEWEST_TESTED[1])


# ------------------------------------------------ Keras 2 for tf.keras


def _route_keras() -> None:
  """Sets `TF_USE_LEGACY_KERAS=1` (before TensorFlow reads it), or refuses."""
  choice = os.environ.get(_LEGACY_KERAS)
  if choice is not None and choice not in _TRUE:
    raise ImportError(
        f"estimator_multigpu: {_LEGACY_KERAS}={choice} routes tf.keras to "
        "Keras 3, which cannot build layers in a graph-mode Estimator "
        f"model_fn; unset {_LEGACY_KERAS} or set it to 1 (tf-keras, Keras 2).")
  if importlib.util.find_spec("tf_keras") is None:
    minor = tensorflow_version()[1]
    raise ImportError(
        f"estimator_multigpu on TensorFlow 2.{minor} needs tf-keras (Keras "
        f"2) for tf.keras: pip install 'tf-keras~=2.{minor}.0'.",
        name="tf_keras")
  os.environ[_LEGACY_KERAS] = "1"


def _check_keras_not_loaded(tf: types.ModuleType) -> None:
  """Refuses a `tf.keras` already loaded as Keras 3; else routes its path.

  TensorFlow imported before this module put Keras 3's API first on
  `tensorflow.__path__` (`from tensorflow.keras import layers`); the same
  import after `TF_USE_LEGACY_KERAS=1` puts tf-keras's first, as here.
  """
  loaded = [vars(tf).get("keras"), vars(tf.compat.v1).get("keras"),
            sys.modules.get("tensorflow.keras")]
  if any(_is_keras_3(value) for value in loaded):
    raise ImportError(
        "estimator_multigpu: tf.keras was already used as Keras 3 in this "
        "process, and Keras 3 cannot build layers in a graph-mode Estimator "
        "model_fn. Import estimator_multigpu before the first use of "
        f"tf.keras, or start Python with {_LEGACY_KERAS}=1.")
  api = os.path.join(
      importlib.util.find_spec("tf_keras").submodule_search_locations[0],
      "api", "_v2")
  if api not in tf.__path__:
    tf.__path__.insert(0, api)


def _is_keras_3(value) -> bool:
  """Whether `tf.keras` (a lazy loader, or what it loaded) is Keras 3."""
  if isinstance(value, internal("keras_loader").KerasLazyLoader):
    return vars(value).get("_tfll_keras_version") == "keras_3"
  return (isinstance(value, types.ModuleType) and
          not vars(value).get("__name__", "tf_keras").startswith("tf_keras"))


# --------------------------------------- names TensorFlow 2.16 removed


def _restore_removed_names() -> None:
  """The five names tensorflow-estimator 2.15.0 imports and TF removed."""
  tf_export = internal("tf_export")
  if not hasattr(tf_export, "ESTIMATOR_API_NAME"):
    tf_export.ESTIMATOR_API_NAME = "estimator"
    tf_export.API_ATTRS["estimator"] = tf_export._Attributes(  # pylint: disable=protected-access
        "_estimator_api_names", "_estimator_api_constants")
    tf_export.API_ATTRS_V1["estimator"] = tf_export._Attributes(  # pylint: disable=protected-access
        "_estimator_api_names_v1", "_estimator_api_constants_v1")
  _restore_module(_TF + "distribute.estimator_training",
                  _estimator_training())
  for name in ("tpu_embedding", "session_support", "tpu_embedding_gradient"):
    _restore_module(_TF + "tpu." + name, _tpu_only(_TF + "tpu." + name))


def _forget_failed_estimator_import() -> None:
  """Drops what a user's `import tensorflow_estimator` before this shim left.

  That import fails half way on TF >= 2.16 and leaves half-initialized
  modules behind, which would fail again; without the shim in place no
  working tensorflow_estimator module can exist, so they all go.
  """
  if _TF + "distribute.estimator_training" in sys.modules:
    return
  for name in [m for m in sys.modules
               if m.split(".")[0] == "tensorflow_estimator"]:
    del sys.modules[name]


def _restore_module(name: str, stand_in: types.ModuleType) -> None:
  try:
    importlib.import_module(name)
  except ImportError:
    sys.modules[name] = stand_in
    parent, _, child = name.rpartition(".")
    setattr(importlib.import_module(parent), child, stand_in)


def _estimator_training() -> types.ModuleType:
  """`estimator_training` without the distribute coordinator TF removed."""
  module = types.ModuleType(_TF + "distribute.estimator_training",
                            "Stand-in from estimator_multigpu.compat.")
  module.init_run_config = _init_run_config
  module.should_run_distribute_coordinator = lambda config: False
  module.train_and_evaluate = module.estimator_train = _no_coordinator
  module.estimator_evaluate = _no_coordinator
  return module


def _init_run_config(config, tf_config: dict) -> None:
  """TF 2.15's `init_run_config`, for every case but the coordinator's."""
  # pylint: disable=protected-access
  experimental = config._experimental_distribute
  if experimental is not None:
    config._train_distribute = (config._train_distribute or
                                experimental.train_distribute)
    config._eval_distribute = (config._eval_distribute or
                               experimental.eval_distribute)
  cluster = tf_config.get("cluster", {})
  if config._train_distribute and (
      (cluster and "master" not in cluster) or
      (experimental is not None and experimental.remote_cluster)):
    _no_coordinator()
  config._distribute_coordinator_mode = None
  config._init_distributed_setting_from_environment_var(tf_config)
  config._maybe_overwrite_session_config_for_distributed_training()


def _no_coordinator(*args, **kwargs):
  del args, kwargs
  raise ValueError(
      f"RunConfig(train_distribute=...) with a TF_CONFIG cluster ran through "
      f"TensorFlow's distribute coordinator, which TensorFlow "
      f"{_version_text()} no longer has. For several machines use "
      "emg.train_and_evaluate (all-reduce between tasks), or TensorFlow 2.15.")


def _tpu_only(name: str) -> types.ModuleType:
  """A TPU-only module TF removed: any name in it refuses when used."""
  module = types.ModuleType(name, "Stand-in from estimator_multigpu.compat.")

  def getattr_(attribute: str):
    if attribute.startswith("__"):
      raise AttributeError(attribute)

    def refuse(*args, **kwargs):
      del args, kwargs
      raise NotImplementedError(
          f"{name}.{attribute} (TPU embeddings) is gone from TensorFlow "
          f"{_version_text()}; TPUEstimator's embedding paths need 2.15.")
    return type(attribute, (), {"__init__": refuse, "__module__": name})
  module.__getattr__ = getattr_
  return module


def _bind_estimator(tf: types.ModuleType) -> None:
  """`tf.estimator` and `tf.compat.v1/v2.estimator`, as on TF 2.15."""
  api = "tensorflow_estimator.python.estimator.api._v{}.estimator"
  try:
    v1, v2 = (importlib.import_module(api.format(k)) for k in (1, 2))
  except ModuleNotFoundError as error:
    if error.name == "tensorflow_estimator":
      raise
    raise TensorFlowMoved(moved_message(
        f"module {error.name}", "tensorflow-estimator 2.15.0"),
        name=error.name) from None
  except ImportError as error:
    missing = re.search(r"cannot import name '(\w+)'", str(error))
    what = f"{error.name}.{missing.group(1) if missing else '?'}"
    raise TensorFlowMoved(moved_message(what, "tensorflow-estimator 2.15.0"),
                          name=error.name) from None
  tf.estimator = tf.compat.v2.estimator = v2
  tf.compat.v1.estimator = v1
  sys.modules.setdefault("tensorflow.estimator", v2)
