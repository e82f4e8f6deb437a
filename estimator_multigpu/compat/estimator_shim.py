"""tensorflow-estimator 2.15.0 as `tf.estimator` on TF 2.15 through 2.21.

`tf.estimator` left TensorFlow in 2.16; tensorflow-estimator 2.15.0 is its
last release. `install()` runs when `estimator_multigpu` is imported:

* On TF 2.15 it does nothing (it does not even import TensorFlow).
* On TF >= 2.16 it
  1. routes `tf.keras` to Keras 2 (`keras_routing`);
  2. gives tensorflow-estimator the five names TF removed (the
     distribute-coordinator module `estimator_training`, which now refuses
     the coordinator's modes; `tf_export.ESTIMATOR_API_NAME` with its
     attribute entries; three TPU-only modules whose names refuse when used);
  3. imports tensorflow-estimator and binds it where TF 2.15 had it:
     `tf.estimator`, `tf.compat.v1.estimator`, `tf.compat.v2.estimator`.

Holds `install()` and the stand-ins for what TF removed.
"""

from __future__ import annotations

import importlib
import re
import sys
import types
from typing import Tuple

from absl import logging

from estimator_multigpu.compat import internals
from estimator_multigpu.compat import keras_routing
from estimator_multigpu.compat import versions

_TF = internals.TF_PYTHON


def install() -> None:
  """Makes the installed TensorFlow line look like 2.15 to the package.

  Raises:
    ModuleNotFoundError: TensorFlow is not installed.
    ImportError: TensorFlow is older than 2.15, Keras cannot be routed to
      tf-keras, or tensorflow-estimator cannot import.
  """
  version = versions.tensorflow_version()
  _check_version(version)
  if version >= (2, 16):
    keras_routing.route_keras()
    tf = importlib.import_module("tensorflow")
    keras_routing.check_not_loaded(tf)
    _forget_failed_estimator_import()
    _restore_removed_names()
    _bind_estimator(tf)


def _check_version(version: Tuple[int, int]) -> None:
  """Refuses a TensorFlow older than 2.15; warns on one newer than tested."""
  if version < versions.FIRST_SUPPORTED:
    raise ImportError(
        f"estimator_multigpu needs TensorFlow 2.15 to 2.21; this is "
        f"{versions.version_text()}. pip install 'tensorflow>=2.15,<2.22'.")
  if version > versions.NEWEST_TESTED:
    logging.warning(
        "estimator_multigpu: TensorFlow %s is newer than the newest tested "
        "(2.%d); an internal that moved will be named in one line.",
        versions.version_text(), versions.NEWEST_TESTED[1])


# --------------------------------------- names TensorFlow 2.16 removed


def _restore_removed_names() -> None:
  """The five names tensorflow-estimator 2.15.0 imports and TF removed."""
  tf_export = internals.internal("tf_export")
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
      f"{versions.version_text()} no longer has. For several machines use "
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
          f"{versions.version_text()}; TPUEstimator's embedding paths "
          "need 2.15.")
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
    raise _estimator_moved(f"module {error.name}", error.name) from None
  except ImportError as error:
    missing = re.search(r"cannot import name '(\w+)'", str(error))
    what = f"{error.name}.{missing.group(1) if missing else '?'}"
    raise _estimator_moved(what, error.name) from None
  tf.estimator = tf.compat.v2.estimator = v2
  tf.compat.v1.estimator = v1
  sys.modules.setdefault("tensorflow.estimator", v2)


def _estimator_moved(what: str, name: str) -> versions.TensorFlowMoved:
  return versions.TensorFlowMoved(
      versions.moved_message(what, "tensorflow-estimator 2.15.0"), name=name)
