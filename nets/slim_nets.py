"""Classifiers from ``tf_slim.nets`` adapted to the zoo's common interface.

Every wrapper has the signature
``network(inputs, num_classes, is_training=False, **kwargs)`` and returns
``(logits, end_points)`` with logits of shape [batch, num_classes] and
``end_points['Logits']`` / ``end_points['Predictions']`` set to the 2-D logits
and their softmax. Each carries ``default_image_size``.

The slim networks are called in fully-convolutional mode
(``spatial_squeeze=False``; ResNets with ``global_pool=True``) and their 4-D
output is reduced by :func:`to_2d_logits`: a 1x1 map is squeezed, a larger one
(from inputs bigger than the nominal size) is averaged. Because the last layer
is a linear 1x1 convolution, averaging its output equals global average
pooling before it, as research/slim's ``global_pool`` option does.

Minimum input sizes follow the architectures: AlexNet, VGG and Inception V1
end in fixed-size VALID layers and need about their default size (Inception
V1 at least 193x193); Inception V2 shrinks its final pooling and accepts
16x16; Inception V3 needs 107x107 for its aux-logits head (75x75 with
``create_aux_logits=False``); ResNets work from 32x32 up.
"""

import functools
from typing import Any, Callable, Dict, Tuple

import tensorflow as tf
import tf_slim as slim
from tf_slim.nets import alexnet
from tf_slim.nets import inception
from tf_slim.nets import overfeat
from tf_slim.nets import resnet_v1
from tf_slim.nets import resnet_v2
from tf_slim.nets import vgg

tf1 = tf.compat.v1

NetOutput = Tuple[tf.Tensor, Dict[str, tf.Tensor]]
NetFn = Callable[..., NetOutput]
ArgScopeFn = Callable[..., dict]


def to_2d_logits(net: tf.Tensor) -> tf.Tensor:
  """Turns a network's class scores into a [batch, num_classes] tensor.

  Args:
    net: Scores of shape [batch, num_classes] or
      [batch, height, width, num_classes].

  Returns:
    ``net`` itself if 2-D, squeezed if its spatial size is 1x1, otherwise
    averaged over the spatial dimensions.
  """
  if net.shape.rank == 2:
    return net
  if net.shape[1:3].as_list() == [1, 1]:
    return tf.squeeze(net, [1, 2], name="SpatialSqueeze")
  return tf.reduce_mean(net, [1, 2], name="GlobalPool")


def _classifier(slim_fn: NetFn, default_image_size: int,
                **fixed_kwargs: Any) -> NetFn:
  """Wraps a ``tf_slim.nets`` function into the zoo's interface.

  Args:
    slim_fn: The tf-slim network function.
    default_image_size: Nominal input height and width.
    **fixed_kwargs: Arguments always passed to ``slim_fn``.

  Returns:
    The wrapped network function.
  """
  @functools.wraps(slim_fn)
  def network(inputs: tf.Tensor, num_classes: int, is_training: bool = False,
              **kwargs: Any) -> NetOutput:
    outputs, end_points = slim_fn(inputs, num_classes,
                                  is_training=is_training,
                                  **{**fixed_kwargs, **kwargs})
    with tf1.name_scope(slim_fn.__name__):
      logits = end_points["Logits"] = to_2d_logits(outputs)
      end_points["Predictions"] = slim.softmax(logits)
    return logits, end_points

  network.default_image_size = default_image_size
  return network


def _fully_convolutional(slim_fn: NetFn, default_image_size: int) -> NetFn:
  """Wraps a net that takes ``spatial_squeeze`` (AlexNet, VGG, Inception)."""
  return _classifier(slim_fn, default_image_size, spatial_squeeze=False)


def _resnet(slim_fn: NetFn) -> NetFn:
  """Wraps a ResNet, which ends with global average pooling."""
  return _classifier(slim_fn, 224, global_pool=True)


SLIM_NETWORKS: Dict[str, Tuple[NetFn, ArgScopeFn]] = {
    "alexnet_v2": (_fully_convolutional(alexnet.alexnet_v2, 224),
                   alexnet.alexnet_v2_arg_scope),
    "inception_v1": (_fully_convolutional(inception.inception_v1, 224),
                     inception.inception_v1_arg_scope),
    "inception_v2": (_fully_convolutional(inception.inception_v2, 224),
                     inception.inception_v2_arg_scope),
    "inception_v3": (_fully_convolutional(inception.inception_v3, 299),
                     inception.inception_v3_arg_scope),
    "overfeat": (_fully_convolutional(overfeat.overfeat, 231),
                 overfeat.overfeat_arg_scope),
    "resnet_v1_50": (_resnet(resnet_v1.resnet_v1_50),
                     resnet_v1.resnet_arg_scope),
    "resnet_v1_101": (_resnet(resnet_v1.resnet_v1_101),
                      resnet_v1.resnet_arg_scope),
    "resnet_v1_152": (_resnet(resnet_v1.resnet_v1_152),
                      resnet_v1.resnet_arg_scope),
    "resnet_v2_50": (_resnet(resnet_v2.resnet_v2_50),
                     resnet_v2.resnet_arg_scope),
    "resnet_v2_101": (_resnet(resnet_v2.resnet_v2_101),
                      resnet_v2.resnet_arg_scope),
    "resnet_v2_152": (_resnet(resnet_v2.resnet_v2_152),
                      resnet_v2.resnet_arg_scope),
    "vgg_a": (_fully_convolutional(vgg.vgg_a, 224), vgg.vgg_arg_scope),
    "vgg_16": (_fully_convolutional(vgg.vgg_16, 224), vgg.vgg_arg_scope),
    "vgg_19": (_fully_convolutional(vgg.vgg_19, 224), vgg.vgg_arg_scope),
}
