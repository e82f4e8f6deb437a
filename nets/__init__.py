"""A tf-slim model zoo for graph-mode (``tf.compat.v1``) Estimator model_fns.

- `nets_factory`: looks up a net by name (`get_network_fn`) with its arg
  scope; the zoo: `lenet`, `cifarnet`, `mlp`, and `slim_nets` (tf_slim's own
  classifiers adapted to the zoo's interface).
- `strides`: how far a net downsamples its images
  (`strides.collapsed_stride`: the size below which its maps vanish).

`slim.batch_norm` (and so every ResNet and Inception) works on TensorFlow
2.15 thanks to `estimator_multigpu.slim_compat`, which importing `nets`
applies (the library itself applies it only when `multi_gpu` wraps a
model_fn).
"""

from estimator_multigpu import slim_compat

slim_compat.apply_all()

# pylint: disable=g-import-not-at-top,wrong-import-position
from nets.nets_factory import get_network_fn
from nets.nets_factory import NETWORK_NAMES

__all__ = ["NETWORK_NAMES", "get_network_fn"]
