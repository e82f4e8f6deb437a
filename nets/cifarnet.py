"""A CIFAR-10-style convolutional network written with tf-slim layers.

Layout: conv 5x5 -> max-pool 3x3/2 -> LRN -> conv 5x5 -> LRN -> max-pool 3x3/2
-> fully connected -> dropout -> fully connected -> logits. All convolutions
and pools use SAME padding, so small inputs (e.g. 8x8 digits) work as well as
the default 32x32 CIFAR images.
"""

from typing import Dict, Tuple

import tensorflow as tf
import tf_slim as slim

tf1 = tf.compat.v1


def _local_response_norm(net: tf.Tensor, name: str) -> tf.Tensor:
  """Applies the local response normalization of the CIFAR-10 model."""
  return tf.nn.local_response_normalization(
      net, depth_radius=4, bias=1.0, alpha=0.001 / 9.0, beta=0.75, name=name)


def cifarnet_arg_scope(weight_decay: float = 0.004) -> dict:
  """Defines the default CifarNet arg scope.

  Args:
    weight_decay: L2 regularization strength for the weights; 0 disables it.

  Returns:
    An arg scope for ``slim.arg_scope``.
  """
  with slim.arg_scope(
      [slim.conv2d, slim.fully_connected],
      weights_regularizer=slim.l2_regularizer(weight_decay),
      weights_initializer=slim.variance_scaling_initializer(),
      biases_initializer=tf1.constant_initializer(0.1),
      activation_fn=tf.nn.relu):
    with slim.arg_scope([slim.conv2d, slim.max_pool2d],
                        padding="SAME") as scope:
      return scope


def cifarnet(inputs: tf.Tensor,
             num_classes: int,
             is_training: bool = False,
             dropout_keep_prob: float = 0.5,
             scope: str = "CifarNet") -> Tuple[tf.Tensor, Dict[str, tf.Tensor]]:
  """Builds a CifarNet classifier.

  Args:
    inputs: Images of shape [batch, height, width, channels].
    num_classes: Number of output classes.
    is_training: Whether dropout is active.
    dropout_keep_prob: Probability of keeping an activation in dropout.
    scope: Variable scope of the network.

  Returns:
    A tuple ``(logits, end_points)``: logits of shape [batch, num_classes]
    and a dict from layer names to their output tensors.
  """
  end_points = {}
  with tf1.variable_scope(scope, "CifarNet", [inputs]):
    net = end_points["conv1"] = slim.conv2d(inputs, 64, [5, 5], scope="conv1")
    net = end_points["pool1"] = slim.max_pool2d(net, [3, 3], 2, scope="pool1")
    net = _local_response_norm(net, name="norm1")
    net = end_points["conv2"] = slim.conv2d(net, 64, [5, 5], scope="conv2")
    net = _local_response_norm(net, name="norm2")
    net = end_points["pool2"] = slim.max_pool2d(net, [3, 3], 2, scope="pool2")
    net = end_points["Flatten"] = slim.flatten(net)
    net = end_points["fc3"] = slim.fully_connected(net, 384, scope="fc3")
    net = slim.dropout(net, dropout_keep_prob, is_training=is_training,
                       scope="dropout3")
    net = end_points["fc4"] = slim.fully_connected(net, 192, scope="fc4")
    logits = end_points["Logits"] = slim.fully_connected(
        net, num_classes, activation_fn=None,
        biases_initializer=tf1.zeros_initializer(), scope="logits")
    end_points["Predictions"] = slim.softmax(logits, scope="Predictions")
  return logits, end_points


cifarnet.default_image_size = 32
