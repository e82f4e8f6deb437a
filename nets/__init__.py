"""A tf-slim model zoo for graph-mode (``tf.compat.v1``) Estimator model_fns.

`slim.batch_norm` (and so every ResNet and Inception) works on TensorFlow
2.15 thanks to `estimator_multigpu.slim_compat`, which importing `nets`
applies (the library itself applies it only when `multi_gpu` wraps a
model_fn).
"""

# pylint: disable=g-import-not-at-top,wrong-import-position
from estimator_multigpu import slim_compat

slim_compat.apply_all()

# pylint: disable=g-import-not-at-top,wrong-import-position
from nets.nets_factory import NETWORK_NAMES
from nets.nets_factory import get_network_fn

__all__ = ["NETWORK_NAMES", "get_network_fn"]
