"""A small LeNet-5-style convolutional network written with tf-slim layers.

Layout: conv 5x5 -> max-pool 2x2 -> conv 5x5 -> max-pool 2x2 -> fully
connected -> dropout -> logits. Convolutions and pools use SAME padding, so the
net accepts any input of at least 1x1 pixels (28x28 MNIST digits by default,
8x8 digits from scikit-learn as well).
"""

from typing import Dict, Tuple

import tensorflow as tf
import tf_slim as slim

tf1 = tf.compat.v1


def lenet_arg_scope(weight_decay: float = 0.0) -> dict:
  """Defines the default LeNet arg scope.

  Args:
    weight_decay: L2 regularization strength for the weights; 0 disables it.

  Returns:
    An arg scope for ``slim.arg_scope``.
  """
  with slim.arg_scope(
      [slim.conv2d, slim.fully_connected],
      weights_regularizer=slim.l2_regularizer(weight_decay),
      weights_initializer=tf1.truncated_normal_initializer(stddev=0.1),
      activation_fn=tf.nn.relu):
    with slim.arg_scope([slim.conv2d, slim.max_pool2d],
                        padding="SAME") as scope:
      return scope


def lenet(inputs: tf.Tensor,
          num_classes: int,
          is_training: bool = False,
          dropout_keep_prob: float = 0.5,
          scope: str = "LeNet") -> Tuple[tf.Tensor, Dict[str, tf.Tensor]]:
  """Builds a LeNet-5-style classifier.

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
  with tf1.variable_scope(scope, "LeNet", [inputs]):
    net = end_points["conv1"] = slim.conv2d(inputs, 32, [5, 5], scope="conv1")
    net = end_points["pool1"] = slim.max_pool2d(net, [2, 2], scope="pool1")
    net = end_points["conv2"] = slim.conv2d(net, 64, [5, 5], scope="conv2")
    net = end_points["pool2"] = slim.max_pool2d(net, [2, 2], scope="pool2")
    net = end_points["Flatten"] = slim.flatten(net)
    net = end_points["fc3"] = slim.fully_connected(net, 512, scope="fc3")
    net = slim.dropout(net, dropout_keep_prob, is_training=is_training,
                       scope="dropout3")
    logits = end_points["Logits"] = slim.fully_connected(
        net, num_classes, activation_fn=None, scope="fc4")
    end_points["Predictions"] = slim.softmax(logits, scope="Predictions")
  return logits, end_points


lenet.default_image_size = 28
