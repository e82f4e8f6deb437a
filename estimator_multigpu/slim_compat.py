"""Small, documented fixes for tf-slim 1.1.0 on TensorFlow 2.15.

All are idempotent and applied when `estimator_multigpu` is imported
(`apply_all`). They replace module references *inside* tf-slim only;
TensorFlow's own modules are left as they are.

1. ``tf_slim.optimize_loss`` tests ``isinstance(g, ops.IndexedSlices)`` with
   ``tensorflow.python.framework.ops``, which no longer defines
   ``IndexedSlices`` in TF 2.15: every call raises AttributeError.
   :func:`patch_optimize_loss` gives tf-slim's optimizers module an ``ops``
   stand-in that has it.

2. ``slim.batch_norm`` builds its default path (updates in ``UPDATE_OPS``, no
   zero-debiasing) on ``tensorflow.python.layers.normalization``, which in TF
   2.15 is a broken lazy alias for ``tf_keras.legacy_tf_layers``: without
   ``tf-keras`` it raises ``No module named 'tf_keras'``, and the tf-keras
   2.15 wheels ship the module as ``tf_keras/src/legacy_tf_layers``, so every
   batch-norm net (ResNets, Inceptions) fails while its graph is built.
   :func:`patch_slim_batch_norm` gives tf-slim a stand-in that resolves to
   ``tf.compat.v1.layers.BatchNormalization`` (the same legacy layer, same
   arguments, updates in ``UPDATE_OPS``, variables named
   ``<scope>/BatchNorm/moving_mean`` etc.). It follows ``TF_USE_LEGACY_KERAS``;
   if ``tf.compat.v1.layers`` cannot import, the Keras 2.15 v1 module is used.

3. Speed: the legacy layers' ``add_weight`` compares each new weight with
   every global variable, and each comparison asks
   ``executing_eagerly_outside_functions()`` before falling back to identity,
   so building a net costs O(variables²) of those calls (a third of
   ResNet-50's 8-tower build). The classes tf-slim gets for batch norm, conv
   and dense layers are thin subclasses whose ``add_weight`` runs with
   identity equality (:func:`_identity_equality`); in graph mode that is what
   the comparisons mean anyway, so behaviour and names are unchanged.

4. ``tf_slim.layers.utils.constant_value`` tests ``isinstance(v, ops.Tensor)``
   and TF 2.15's ``ops`` has no ``Tensor``: :func:`patch_slim_utils_tensor`.
"""

import contextlib
import functools
import importlib
from typing import Any, Callable

import tensorflow as tf
from absl import logging
from tensorflow.python.framework import tensor as _tensor_lib
from tf_slim.layers import layers as _slim_layers
from tf_slim.layers import optimizers as _slim_optimizers
from tf_slim.layers import utils as _slim_utils

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


@contextlib.contextmanager
def _identity_equality():
  """Makes `==` and `hash` of tensors and variables plain identity for a while.

  Fix 3 of the module docstring. Outside graph mode nothing changes. The
  switch is process-wide while it lasts: another thread comparing eager
  tensors in that moment would compare by identity.
  """
  tensor_class = _tensor_lib.Tensor
  if (not getattr(tensor_class, "_USE_EQUALITY", False)
      or tf1.executing_eagerly_outside_functions()):
    yield
    return
  tensor_class._USE_EQUALITY = False  # pylint: disable=protected-access
  try:
    yield
  finally:
    tensor_class._USE_EQUALITY = True  # pylint: disable=protected-access


@functools.lru_cache(maxsize=None)
def _with_identity_equality(layer_class: type) -> type:
  """`layer_class`, with `add_weight` run under :func:`_identity_equality`.

  Args:
    layer_class: a legacy (v1) Keras layer class.

  Returns:
    A subclass of the same name; behaviour and variable names are unchanged.
  """
  def add_weight(self, *args, **kwargs):
    with _identity_equality():
      return super(subclass, self).add_weight(*args, **kwargs)

  subclass = type(layer_class.__name__, (layer_class,),
                  {"add_weight": add_weight, "__doc__": layer_class.__doc__,
                   "__module__": __name__})
  return subclass


class _IdentityEqualityLayers:
  """Stand-in for a ``tensorflow.python.layers`` module inside tf-slim.

  Layer classes come back wrapped by :func:`_with_identity_equality`; every
  other attribute is the module's own.
  """

  def __init__(self, module):
    self.module = module

  def __getattr__(self, name):
    value = getattr(self.module, name)
    if isinstance(value, type) and hasattr(value, "add_weight"):
      return _with_identity_equality(value)
    return value


class _KerasNormalizationLayers:
  """Stand-in for ``tensorflow.python.layers.normalization`` inside tf-slim.

  Attributes resolve lazily so that importing the shim does not import Keras.
  """

  @property
  def BatchNormalization(self) -> type:  # pylint: disable=invalid-name
    """The legacy graph-mode batch-normalization layer class."""
    return _with_identity_equality(_legacy_layer("BatchNormalization"))

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


def patch_slim_layer_weights() -> bool:
  """Builds tf-slim's conv and dense layers' weights with identity equality.

  Returns:
    True if this call installed the patch, False if it was already installed.
  """
  if isinstance(_slim_layers.convolutional_layers, _IdentityEqualityLayers):
    return False
  for name in ("convolutional_layers", "core_layers"):
    setattr(_slim_layers, name,
            _IdentityEqualityLayers(getattr(_slim_layers, name)))
  return True


class _OpsWithTensor:
  """tf-slim's view of `tensorflow.python.framework.ops`, plus Tensor."""

  Tensor = _tensor_lib.Tensor

  def __init__(self, ops_module):
    self._ops = ops_module

  def __getattr__(self, name):
    return getattr(self._ops, name)


def patch_slim_utils_tensor() -> bool:
  """Lets `tf_slim.layers.utils.constant_value` find `ops.Tensor` again.

  Fix 4: `slim.batch_norm`'s own paths (2-D inputs with `fused`, or
  zero-debiasing) call it and raise AttributeError on TF 2.15 without this.

  Returns:
    True if this call installed the patch, False if nothing was needed.
  """
  if hasattr(_slim_utils.ops, "Tensor"):
    return False
  _slim_utils.ops = _OpsWithTensor(_slim_utils.ops)
  return True


def apply_all() -> None:
  """Applies every fix of this module (idempotent)."""
  patch_optimize_loss()
  patch_slim_utils_tensor()
  patch_slim_batch_norm()
  patch_slim_layer_weights()
