"""A small BERT-style classifier written the way Google BERT writes it.

`modeling.py`, `optimization.py` and `run_classifier.py` of google-research/bert
reduced to one transformer layer: `tf.compat.v1.layers.dense` and
`get_variable` under `bert/...` scopes, tf-slim `layer_norm`, an
`AdamWeightDecayOptimizer` that subclasses `tf.compat.v1.train.Optimizer`
and never touches `global_step`, `tf.gradients` over
`tf.compat.v1.trainable_variables()`, `tf.clip_by_global_norm`, a
hand-incremented global step, and a `TPUEstimatorSpec` as the model_fn's
result (BERT runs in `TPUEstimator(use_tpu=False)`). Dropout is 0 so that
runs are comparable.
"""

import re

import numpy as np
import tensorflow as tf
import tf_slim as slim

import estimator_multigpu as emg

tf1 = tf.compat.v1
VOCAB, SEQ, HIDDEN, HEADS, FFN, CLASSES = 11, 5, 8, 2, 16, 3


class AdamWeightDecayOptimizer(tf1.train.Optimizer):
  """BERT's Adam with decoupled weight decay; no bias correction."""

  def __init__(self, learning_rate, weight_decay_rate=0.01, beta_1=0.9,
               beta_2=0.999, epsilon=1e-6,
               exclude_from_weight_decay=("LayerNorm", "layer_norm", "bias"),
               name="AdamWeightDecayOptimizer"):
    super().__init__(False, name)
    self.learning_rate = learning_rate
    self.weight_decay_rate = weight_decay_rate
    self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
    self.exclude_from_weight_decay = exclude_from_weight_decay

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    del global_step  # BERT's optimizer leaves it alone.
    assignments = []
    for grad, param in grads_and_vars:
      if grad is None or param is None:
        continue
      param_name = re.match("^(.*):\\d+$", param.name).group(1)
      m = tf1.get_variable(param_name + "/adam_m", param.shape.as_list(),
                           tf.float32, trainable=False,
                           initializer=tf1.zeros_initializer())
      v = tf1.get_variable(param_name + "/adam_v", param.shape.as_list(),
                           tf.float32, trainable=False,
                           initializer=tf1.zeros_initializer())
      next_m = (tf.multiply(self.beta_1, m) +
                tf.multiply(1.0 - self.beta_1, grad))
      next_v = (tf.multiply(self.beta_2, v) +
                tf.multiply(1.0 - self.beta_2, tf.square(grad)))
      update = next_m / (tf.sqrt(next_v) + self.epsilon)
      if not any(word in param_name
                 for word in self.exclude_from_weight_decay):
        update += self.weight_decay_rate * param
      assignments += [param.assign(param - self.learning_rate * update),
                      m.assign(next_m), v.assign(next_v)]
    return tf.group(*assignments, name=name)


def create_optimizer(loss, learning_rate, clip_norm):
  """BERT's `optimization.create_optimizer`, without the warm-up schedule.

  BERT decays the rate with `global_step`, which its own train_op increments
  in an op that is not ordered with the update; a constant rate keeps the
  comparison free of that race (it is the same with one device).
  """
  global_step = tf1.train.get_or_create_global_step()
  optimizer = emg.TowerOptimizer(AdamWeightDecayOptimizer(learning_rate))
  tvars = tf1.trainable_variables()
  grads = tf.gradients(loss, tvars)
  if clip_norm is not None:
    grads, _ = tf.clip_by_global_norm(grads, clip_norm=clip_norm)
  train_op = optimizer.apply_gradients(zip(grads, tvars),
                                       global_step=global_step)
  return tf.group(train_op, [global_step.assign(global_step + 1)])


def _dense(x, units, name, activation=None):
  return tf1.layers.dense(x, units, activation=activation, name=name,
                          kernel_initializer=tf1.truncated_normal_initializer(
                              stddev=0.2, seed=len(name)))


def _attention(x, mask):
  """One multi-head self-attention block (BERT's attention_layer)."""
  batch = tf.shape(x)[0]
  size = HIDDEN // HEADS

  def heads(tensor):
    return tf.transpose(tf.reshape(tensor, [batch, SEQ, HEADS, size]),
                        [0, 2, 1, 3])

  q, k, v = (heads(_dense(x, HIDDEN, name)) for name in
             ("query", "key", "value"))
  scores = tf.matmul(q, k, transpose_b=True) / np.sqrt(size)
  adder = (1.0 - tf.cast(mask[:, None, None, :], tf.float32)) * -10000.0
  context = tf.matmul(tf.nn.softmax(scores + adder), v)
  return tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [batch, SEQ, HIDDEN])


def encoder(input_ids, input_mask):
  """Embeddings, one transformer layer and the pooler; returns the pool."""
  with tf1.variable_scope("bert"):
    with tf1.variable_scope("embeddings"):
      table = tf1.get_variable("word_embeddings", [VOCAB, HIDDEN],
                               initializer=tf1.truncated_normal_initializer(
                                   stddev=0.2, seed=1))
      positions = tf1.get_variable(
          "position_embeddings", [SEQ, HIDDEN],
          initializer=tf1.truncated_normal_initializer(stddev=0.2, seed=2))
      x = slim.layer_norm(tf.gather(table, input_ids) + positions,
                          begin_norm_axis=-1, begin_params_axis=-1,
                          scope="LayerNorm")
    with tf1.variable_scope("encoder/layer_0"):
      with tf1.variable_scope("attention"):
        attended = _dense(_attention(x, input_mask), HIDDEN, "output")
        x = slim.layer_norm(x + attended, begin_norm_axis=-1,
                            begin_params_axis=-1, scope="LayerNorm")
      hidden = _dense(x, FFN, "intermediate", activation=tf.nn.gelu)
      x = slim.layer_norm(x + _dense(hidden, HIDDEN, "output"),
                          begin_norm_axis=-1, begin_params_axis=-1,
                          scope="output/LayerNorm")
    with tf1.variable_scope("pooler"):
      return _dense(x[:, 0], HIDDEN, "dense", activation=tf.tanh)


def model_fn(features, labels, mode, params):
  """BERT `run_classifier.model_fn_builder`'s model_fn: a TPUEstimatorSpec."""
  del labels
  pooled = encoder(features["input_ids"], features["input_mask"])
  output_weights = tf1.get_variable(
      "output_weights", [CLASSES, HIDDEN],
      initializer=tf1.truncated_normal_initializer(stddev=0.2, seed=3))
  output_bias = tf1.get_variable("output_bias", [CLASSES],
                                 initializer=tf1.zeros_initializer())
  logits = tf.matmul(pooled, output_weights, transpose_b=True) + output_bias
  log_probs = tf.nn.log_softmax(logits, axis=-1)
  one_hot = tf.one_hot(features["label_ids"], CLASSES)
  per_example_loss = -tf.reduce_sum(one_hot * log_probs, axis=-1)
  loss = tf.reduce_mean(per_example_loss)
  if mode == tf.estimator.ModeKeys.TRAIN:
    train_op = create_optimizer(loss, params.get("learning_rate", 0.01),
                                params.get("clip_norm"))
    return tf1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss,
                                              train_op=train_op)
  if mode == tf.estimator.ModeKeys.EVAL:
    def metric_fn(per_example_loss, label_ids, logits):
      predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
      return {"eval_accuracy": tf1.metrics.accuracy(label_ids, predictions),
              "eval_loss": tf1.metrics.mean(per_example_loss)}
    return tf1.estimator.tpu.TPUEstimatorSpec(
        mode, loss=loss, eval_metrics=(metric_fn, [
            per_example_loss, features["label_ids"], logits]))
  return tf1.estimator.tpu.TPUEstimatorSpec(
      mode, predictions={"probabilities": tf.exp(log_probs)})


def features(batch, seed=0):
  """A batch of BERT classifier features, as numpy arrays."""
  rng = np.random.RandomState(seed)
  lengths = rng.randint(2, SEQ + 1, size=batch)
  mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
  return {"input_ids": rng.randint(0, VOCAB, size=(batch, SEQ)) * mask,
          "input_mask": mask,
          "segment_ids": np.zeros((batch, SEQ), np.int32),
          "label_ids": rng.randint(0, CLASSES, size=batch).astype(np.int32)}
