"""Small, documented fixes for tf-slim 1.1.0 on TensorFlow 2.15.

All are idempotent. `apply_all` applies them once per process (`multi_gpu`
calls it when it wraps a model_fn, `nets/` on import; later calls return at
once). They replace module references
*inside* tf-slim only; TensorFlow's own modules are left as they are.

1. tf-slim names TensorFlow symbols where TF 2.15 no longer has them:
   ``ops.Tensor`` and ``ops.IndexedSlices`` (``tf_slim.optimize_loss``,
   ``batch_norm`` on a 2-D input, ``create_train_op`` with gradient
   multipliers), ``array_ops.stack``, ``control_flow_ops.cond`` (streaming
   AUC), ``variable_scope.variable`` (``local_variable``), .... :data:`MOVED`
   lists every such name, found by scanning tf-slim's source (the test
   ``tests/nets/test_slim_surface.py`` repeats the scan and fails on any name
   still missing); :func:`patch_moved_names` gives each tf-slim module a
   stand-in for the TensorFlow module it imported, with the moved names.

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
"""

import contextlib
import functools
import importlib
import pkgutil
import types
from typing import Any, Callable

from absl import logging
import tensorflow as tf
import tf_slim
from tf_slim.layers import layers as _slim_layers

from estimator_multigpu import compat

_tensor_lib = compat.internal("tensor")

tf1 = tf.compat.v1

_STOCK_NORMALIZATION_LAYERS = _slim_layers.normalization_layers


@functools.lru_cache(maxsize=None)
def _legacy_layer(name: str) -> Any:
  """Returns the legacy (v1) Keras layer class or function called ``name``.

  Args:
    name: Attribute of ``tf.compat.v1.layers``, e.g. ``"BatchNormalization"``.

  Returns:
    ``tf.compat.v1.layers.<name>`` when it can be imported, otherwise the same
    attribute of the Keras 2 module that ``tf.compat.v1.layers`` normally
    aliases (``compat.INTERNALS["keras_v1_layers"]``).

  Raises:
    ImportError: If neither source of legacy layers can be imported.
  """
  try:
    return getattr(tf1.layers, name)  # Lazy: the import happens here.
  except ImportError as error:
    logging.warning("tf.compat.v1.layers unavailable (%s); using %s.", error,
                    compat.INTERNALS["keras_v1_layers"].module)
  return getattr(compat.internal("keras_v1_layers"), name)


@contextlib.contextmanager
def _identity_equality():
  """Makes `==` and `hash` of tensors and variables plain identity for a while.

  Fix 3 of the module docstring. Outside graph mode nothing changes. The
  switch is process-wide while it lasts: another thread comparing eager
  tensors in that moment would compare by identity.
  """
  tensor_class = _tensor_lib.Tensor
  if (not compat.private(tensor_class, "_USE_EQUALITY", False)
      or tf1.executing_eagerly_outside_functions()):
    yield
    return
  compat.set_private(tensor_class, "_USE_EQUALITY", False)
  try:
    yield
  finally:
    compat.set_private(tensor_class, "_USE_EQUALITY", True)


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



# Per TensorFlow module tf-slim imports: names it uses there that TF 2.15
# moved, and where each lives now (a `compat.INTERNALS` key, the attribute).
MOVED = {
    "tensorflow.python.framework.ops": {
        "Tensor": ("tensor", "Tensor"),
        "IndexedSlices": ("slim_indexed_slices", "IndexedSlices")},
    "tensorflow.python.ops.array_ops": {
        "stack": ("slim_array_ops_stack", "stack"),
        "unstack": ("slim_array_ops_stack", "unstack")},
    "tensorflow.python.ops.control_flow_ops": {
        "cond": ("slim_cond", "cond"),
        "case": ("slim_case", "case"),
        "while_loop": ("slim_while_loop", "while_loop"),
        "Assert": ("slim_assert", "Assert")},
    "tensorflow.python.ops.variable_scope": {
        "variable": ("slim_variable_v1", "VariableV1")},
}


class _WithMovedNames:
  """A TensorFlow module as tf-slim sees it: the module plus its moved names.

  Attributes the module has are its own; the others come from :data:`MOVED`.
  """

  def __init__(self, module: types.ModuleType, moved: dict):
    self.module = module
    self._moved = moved

  def __getattr__(self, name):
    if hasattr(self.module, name) or name not in self._moved:
      return getattr(self.module, name)
    key, attribute = self._moved[name]
    return getattr(compat.internal(key), attribute)


def slim_modules() -> list:
  """Every tf-slim module (tests excluded), imported."""
  names = [info.name for info in pkgutil.walk_packages(
      tf_slim.__path__, "tf_slim.") if not info.name.endswith("_test")]
  return [tf_slim] + [importlib.import_module(name) for name in names]


def patch_moved_names() -> int:
  """Gives tf-slim the TensorFlow names TF 2.15 moved (fix 1).

  Returns:
    How many module references this call replaced (0 once applied).
  """
  replaced = 0
  for module in slim_modules():
    for alias, value in list(vars(module).items()):
      if (isinstance(value, types.ModuleType) and value.__name__ in MOVED and
          any(not hasattr(value, name) for name in MOVED[value.__name__])):
        setattr(module, alias, _WithMovedNames(value, MOVED[value.__name__]))
        replaced += 1
  return replaced


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


@functools.cache
def apply_all() -> None:
  """Applies every fix of this module, once per process (later calls do
  nothing; the `patch_*` functions re-apply one fix)."""
  patch_moved_names()
  patch_slim_batch_norm()
  patch_slim_layer_weights()
