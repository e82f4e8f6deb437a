"""`tf.keras` routed to Keras 2 (tf-keras) on TF >= 2.16.

Holds `route_keras()` (sets `TF_USE_LEGACY_KERAS=1` before TensorFlow reads
it, or refuses the user's `0` in one line) and `check_not_loaded(tf)`
(refuses a `tf.keras` already loaded as Keras 3; puts tf-keras's API first
on `tensorflow.__path__`). Keras 3 cannot build layers in a graph-mode
Estimator model_fn; `estimator_shim.install()` calls both.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types

from estimator_multigpu.compat import internals
from estimator_multigpu.compat import members
from estimator_multigpu.compat import versions

LEGACY_KERAS = "TF_USE_LEGACY_KERAS"
_TRUE = ("true", "True", "1")


def route_keras() -> None:
  """Sets `TF_USELEGACY_KERAS=1` (before TensorFlow reads it), or refuses."""
  choice = os.environ.get(LEGACY_KERAS)
  if choice is not None and choice not in _TRUE:
    raise ImportError(
        f"estimator_multigpu: {LEGACY_KERAS}={choice} routes tf.keras to "
        "Keras 3, which cannot build layers in a graph-mode Estimator "
        f"model_fn; unset {LEGACY_KERAS} or set it to 1 (tf-keras, Keras 2).")
  if importlib.util.find_spec("tf_keras") is None:
    minor = versions.tensorflow_version()[1]
    raise ImportError(
        f"estimator_multigpu on TensorFlow 2.{minor} needs tf-keras (Keras "
        f"2) for tf.keras: pip install 'tf-keras~=2.{minor}.0'.",
        name="tf_keras")
  os.environ[LEGACY_KERAS] = "1"


def check_not_loaded(tf: types.ModuleType) -> None:
  """Refuses a `tf.keras` already loaded as Keras 3; else routes its path.

  TensorFlow imported before this module put Keras 3's API first on
  `tensorflow.__path__` (`from tensorflow.keras import layers`); the same
  import after `TF_USELEGACY_KERAS=1` puts tf-keras's first, as here.
  """
  loaded = [vars(tf).get("keras"), vars(tf.compat.v1).get("keras"),
            sys.modules.get("tensorflow.keras")]
  if any(_is_keras_3(value) for value in loaded):
    raise ImportError(
        "estimator_multigpu: tf.keras was already used as Keras 3 in this "
        "process, and Keras 3 cannot build layers in a graph-mode Estimator "
        "model_fn. Import estimator_multigpu before the first use of "
        f"tf.keras, or start Python with {LEGACY_KERAS}=1.")
  api = os.path.join(
      importlib.util.find_spec("tf_keras").submodule_search_locations[0],
      "api", "_v2")
  if api not in tf.__path__:
    tf.__path__.insert(0, api)


def _is_keras_3(value) -> bool:
  """Whether `tf.keras` (a lazy loader, or what it loaded) is Keras 3."""
  if isinstance(value, internals.internal("keras_loader").KerasLazyLoader):
    return members.private(value, "_tfll_keras_version", None,
                           own=True) == "keras_3"
  return (isinstance(value, types.ModuleType) and
          not vars(value).get("__name__", "tf_keras").startswith("tf_keras"))
