"""A multi-layer perceptron over flattened images, written with tf-slim layers.

Layout: flatten -> ``hidden_units`` fully connected ReLU layers (each followed
by dropout while training) -> logits. Any image size works; the default of
8x8 matches scikit-learn's digits.
"""

from typing import Dict, Sequence, Tuple

import tensorflow as tf
import tf_slim as slim

tf1 = tf.compat.v1

DEFAULT_HIDDEN_UNITS = (128, 64)


def mlp_arg_scope(weight_decay: float = 0.0) -> dict:
  """Defines the default MLP arg scope.

  Args:
    weight_decay: L2 regularization strength for the weights; 0 disables it.

  Returns:
    An arg scope for ``slim.arg_scope``.
  """
  with slim.arg_scope(
      [slim.fully_connected],
      weights_regularizer=slim.l2_regularizer(weight_decay),
      weights_initializer=slim.variance_scaling_initializer(),
      activation_fn=tf.nn.relu) as scope:
    return scope


def mlp(inputs: tf.Tensor,
        num_classes: int,
        is_training: bool = False,
        hidden_units: Sequence[int] = DEFAULT_HIDDEN_UNITS,
        dropout_keep_prob: float = 0.8,
        scope: str = "MLP") -> Tuple[tf.Tensor, Dict[str, tf.Tensor]]:
  """Builds a multi-layer perceptron classifier.

  Args:
    inputs: Images of shape [batch, height, width, channels] (or any tensor
      whose non-batch dimensions are flattened into features).
    num_classes: Number of output classes.
    is_training: Whether dropout is active.
    hidden_units: Width of each hidden layer, from input to output.
    dropout_keep_prob: Probability of keeping an activation in dropout.
    scope: Variable scope of the network.

  Returns:
    A tuple ``(logits, end_points)``: logits of shape [batch, num_classes]
    and a dict from layer names to their output tensors.
  """
  end_points = {}
  with tf1.variable_scope(scope, "MLP", [inputs]):
    net = end_points["Flatten"] = slim.flatten(inputs)
    for index, units in enumerate(hidden_units, start=1):
      name = "fc%d" % index
      net = end_points[name] = slim.fully_connected(net, units, scope=name)
      net = slim.dropout(net, dropout_keep_prob, is_training=is_training,
                         scope="dropout%d" % index)
    logits = end_points["Logits"] = slim.fully_connected(
        net, num_classes, activation_fn=None, scope="logits")
    end_points["Predictions"] = slim.softmax(logits, scope="Predictions")
  return logits, end_points


mlp.default_image_size = 8
