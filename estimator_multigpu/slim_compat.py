"""Small, documented fixes that let tf-slim 1.1.0 run on TensorFlow 2.15.

- `tf_slim.optimize_loss` tests `isinstance(g, ops.IndexedSlices)` with
  `tensorflow.python.framework.ops`, which no longer defines `IndexedSlices`
  in TF 2.15 (it moved to `indexed_slices`): every call raises
  AttributeError. `patch_optimize_loss` points tf-slim's module at the class.

Each patch is idempotent and applied when `estimator_multigpu` is imported.
"""

import tensorflow as tf
from tf_slim.layers import optimizers as slim_optimizers


def patch_optimize_loss() -> None:
  """Lets `tf_slim.optimize_loss` find `ops.IndexedSlices` again."""
  ops_module = slim_optimizers.ops
  if not hasattr(ops_module, "IndexedSlices"):
    ops_module.IndexedSlices = tf.IndexedSlices


def apply_all() -> None:
  """Applies every patch of this module."""
  patch_optimize_loss()
