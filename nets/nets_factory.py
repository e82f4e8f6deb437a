"""Looks up zoo networks by name and binds their arg scopes.

Example::

  network_fn = nets_factory.get_network_fn("lenet", num_classes=10,
                                           weight_decay=1e-4, is_training=True)
  logits, end_points = network_fn(images)
"""

import functools
from typing import Any, Dict, Tuple

import tensorflow as tf
import tf_slim as slim

from nets import cifarnet
from nets import lenet
from nets import mlp
from nets import slim_nets
from nets.slim_nets import ArgScopeFn
from nets.slim_nets import NetFn
from nets.slim_nets import NetOutput

_NETWORKS: Dict[str, Tuple[NetFn, ArgScopeFn]] = {
    "cifarnet": (cifarnet.cifarnet, cifarnet.cifarnet_arg_scope),
    "lenet": (lenet.lenet, lenet.lenet_arg_scope),
    "mlp": (mlp.mlp, mlp.mlp_arg_scope),
    **slim_nets.SLIM_NETWORKS,
}

NETWORK_NAMES = sorted(_NETWORKS)


def _lookup(name: str) -> Tuple[NetFn, ArgScopeFn]:
  """Returns the network function and arg-scope function called ``name``.

  Args:
    name: Name of a network.

  Returns:
    ``(network function, arg-scope function)``.

  Raises:
    ValueError: If ``name`` is not a known network.
  """
  if name not in _NETWORKS:
    raise ValueError("Unknown network `%s`; expected one of: %s." %
                     (name, ", ".join(NETWORK_NAMES)))
  return _NETWORKS[name]


def get_network_fn(name: str, num_classes: int, weight_decay: float = 0.0,
                   is_training: bool = False) -> NetFn:
  """Returns a function that builds network ``name`` on a batch of images.

  Args:
    name: One of :data:`NETWORK_NAMES`.
    num_classes: Number of output classes.
    weight_decay: L2 regularization strength of the network's weights;
      0 adds no regularization losses.
    is_training: Whether dropout and batch-norm run in training mode.

  Returns:
    ``network_fn(images, **kwargs) -> (logits, end_points)`` with logits of
    shape [batch, num_classes]; extra keyword arguments go to the network.
    It has attribute ``default_image_size``.

  Raises:
    ValueError: If ``name`` is not a known network.
  """
  net_fn, arg_scope_fn = _lookup(name)

  @functools.wraps(net_fn)
  def network_fn(images: tf.Tensor, **kwargs: Any) -> NetOutput:
    with slim.arg_scope(arg_scope_fn(weight_decay=weight_decay)):
      return net_fn(images, num_classes, is_training=is_training, **kwargs)

  network_fn.default_image_size = net_fn.default_image_size
  return network_fn
