"""A tf-slim model zoo for graph-mode (``tf.compat.v1``) Estimator model_fns.

`slim.batch_norm` (and so every ResNet and Inception) works on TensorFlow
2.15 thanks to `estimator_multigpu.slim_compat`, applied when the package is
imported.
"""

from estimator_multigpu.nets.nets_factory import NETWORK_NAMES
from estimator_multigpu.nets.nets_factory import get_network_fn

__all__ = ["NETWORK_NAMES", "get_network_fn"]
