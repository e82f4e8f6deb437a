"""Small, documented fixes that let tf-slim 1.1.0 run on TensorFlow 2.15.

Both are idempotent and applied when `estimator_multigpu` is imported
(`apply_all`); TensorFlow's own modules are left as they are.

1. ``tf_slim.optimize_loss`` tests ``isinstance(g, ops.IndexedSlices)`` with
   ``tensorflow.python.framework.ops``, which no longer defines
   ``IndexedSlices`` in TF 2.15: every call raises AttributeError.
   :func:`patch_optimize_loss` gives tf-slim's optimizers module an ``ops``
   stand-in that has it.

2. ``slim.batch_norm``, why:
  ``slim.batch_norm`` (tf-slim 1.1.0) builds its default path (updates in
  ``UPDATE_OPS``, no zero-debiasing) on
  ``tensorflow.python.layers.normalization.BatchNormalization``. In TF 2.15
  that module is only a lazy alias for
  ``tf_keras.legacy_tf_layers.normalization``, and the alias is broken:

  * without the ``tf-keras`` package it fails with
    ``ModuleNotFoundError: No module named 'tf_keras'``;
  * with ``tf-keras`` 2.15.0 or 2.15.1 installed it still fails, with
    ``No module named 'tf_keras.legacy_tf_layers'``, because those wheels ship
    the module as ``tf_keras/src/legacy_tf_layers``.

  Every tf-slim network that uses batch norm (ResNets, Inceptions) therefore
  raises while its graph is built. The Keras 2.15 class exposed as
  ``tf.compat.v1.layers.BatchNormalization`` is the same legacy layer, takes
  the same constructor arguments and, in graph mode, puts its moving-average
  updates into ``tf.compat.v1.GraphKeys.UPDATE_OPS`` and names its variables
  ``<scope>/BatchNorm/moving_mean`` etc., exactly as tf-slim expects.

What it does:
  :func:`patch_slim_batch_norm` replaces the ``normalization_layers`` module
  reference *inside* ``tf_slim.layers.layers`` with a small stand-in that
  resolves to the working Keras class on first use. TensorFlow's own module is
  left untouched, so nothing else in the process is affected.

  The class is looked up in ``tf.compat.v1.layers`` first (this follows
  ``TF_USE_LEGACY_KERAS``, so with ``tf-keras`` installed and the variable set
  it is the tf-keras class). If that fails -- ``TF_USE_LEGACY_KERAS=1`` without
  ``tf-keras`` installed makes it raise ``ImportError`` on first use -- the
  Keras 2.15 package's v1 API module is used directly.
"""

import functools
import importlib
from typing import Any, Callable

import tensorflow as tf
from absl import logging
from tf_slim.layers import layers as _slim_layers
from tf_slim.layers import optimizers as _slim_optimizers

tf1 = tf.compat.v1

# Module that backs ``tf.compat.v1.layers`` when it is taken from Keras 2.x.
_KERAS_V1_LAYERS = "keras.api._v1.keras.__internal__.legacy.layers"
_STOCK_NORMALIZATION_LAYERS = _slim_layers.normalization_layers


@functools.lru_cache(maxsize=None)
def _legacy_layer(name: str) -> Any:
  """Returns the legacy (v1) Keras layer class or function called ``name``.

  Args:
    name: Attribute of ``tf.compat.v1.layers``, e.g. ``"BatchNormalization"``.

  Returns:
    ``tf.compat.v1.layers.<name>`` when it can be imported, otherwise the same
    attribute of the Keras 2.x module that ``tf.compat.v1.layers`` normally
    aliases.

  Raises:
    ImportError: If neither source of legacy layers can be imported.
  """
  try:
    return getattr(tf1.layers, name)  # Lazy: the import happens here.
  except ImportError as error:
    logging.warning("tf.compat.v1.layers unavailable (%s); using %s.",
                    error, _KERAS_V1_LAYERS)
  return getattr(importlib.import_module(_KERAS_V1_LAYERS), name)


class _KerasNormalizationLayers:
  """Stand-in for ``tensorflow.python.layers.normalization`` inside tf-slim.

  Attributes resolve lazily so that importing the shim does not import Keras.
  """

  @property
  def BatchNormalization(self) -> type:  # pylint: disable=invalid-name
    """The legacy graph-mode batch-normalization layer class."""
    return _legacy_layer("BatchNormalization")

  @property
  def batch_normalization(self) -> Callable[..., Any]:
    """The functional form of :attr:`BatchNormalization`."""
    return _legacy_layer("batch_normalization")


def is_slim_batch_norm_patched() -> bool:
  """Tells whether tf-slim currently uses the working batch-norm class.

  Returns:
    True if :func:`patch_slim_batch_norm` is in effect.
  """
  return isinstance(_slim_layers.normalization_layers,
                    _KerasNormalizationLayers)


def patch_slim_batch_norm() -> bool:
  """Points ``slim.batch_norm`` at ``tf.compat.v1.layers.BatchNormalization``.

  Idempotent: calling it again once the patch is in place does nothing.

  Returns:
    True if this call installed the patch, False if it was already installed.
  """
  if is_slim_batch_norm_patched():
    return False
  _slim_layers.normalization_layers = _KerasNormalizationLayers()
  logging.debug("tf-slim batch_norm now uses tf.compat.v1.layers.")
  return True


def unpatch_slim_batch_norm() -> None:
  """Restores tf-slim's stock (broken on TF 2.15) normalization module.

  Meant for tests that reproduce the original failure.
  """
  _slim_layers.normalization_layers = _STOCK_NORMALIZATION_LAYERS



class _OpsWithIndexedSlices:
  """tf-slim's view of `tensorflow.python.framework.ops`, plus IndexedSlices."""

  IndexedSlices = tf.IndexedSlices

  def __init__(self, ops_module):
    self._ops = ops_module

  def __getattr__(self, name):
    return getattr(self._ops, name)


def patch_optimize_loss() -> bool:
  """Lets `tf_slim.optimize_loss` find `ops.IndexedSlices` again.

  Returns:
    True if this call installed the patch, False if nothing was needed.
  """
  if hasattr(_slim_optimizers.ops, "IndexedSlices"):
    return False
  _slim_optimizers.ops = _OpsWithIndexedSlices(_slim_optimizers.ops)
  return True


def apply_all() -> None:
  """Applies every fix of this module (idempotent)."""
  patch_optimize_loss()
  patch_slim_batch_norm()
