"""Plain nets stay per shard: every net in `nets/` and a BERT-style
model_fn gather no per-example tensor on 2 towers (contract 24: speed is
kept). Statistics all-reduced are counted apart (none here either)."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

from nets import nets_factory
from tests import bert_like
from tests import harness

tf1 = tf.compat.v1
TRAIN, EVAL = tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.EVAL
# (net, image size): the smallest each net takes, to build quickly.
NETS = {"mlp": 8, "lenet": 28, "cifarnet": 32, "resnet_v1_50": 32,
        "inception_v1": 224, "alexnet_v2": 224, "overfeat": 231,
        "vgg_16": 224, "inception_v2": 224, "inception_v3": 299}


def _net_model_fn(name, dense_labels=False):
  def model_fn(features, labels, mode):
    network = nets_factory.get_network_fn(name, num_classes=3,
                                          weight_decay=1e-4,
                                          is_training=mode == TRAIN)
    logits, _ = network(features)
    if dense_labels:  # flattens its inputs by slices of their shapes.
      loss = tf1.losses.softmax_cross_entropy(tf.one_hot(labels, 3), logits,
                                              label_smoothing=0.1)
    else:
      loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    loss = loss + tf1.losses.get_regularization_loss()
    optimizer = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.1, 0.9))
    train_op = optimizer.minimize(loss, tf1.train.get_global_step())
    update = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
    return tf.estimator.EstimatorSpec(
        mode, loss=loss, train_op=tf.group(train_op, *update),
        eval_metric_ops={"accuracy": tf1.metrics.accuracy(
            labels, tf.argmax(logits, 1))})
  return model_fn


def _rewrites(model_fn, features, labels, mode, session_config, **options):
  with tf.Graph().as_default() as graph:
    tf1.train.get_or_create_global_step()
    fn = emg.multi_gpu(model_fn, devices=harness.cpu_devices(2),
                       global_batch=True, **options)
    harness.call(fn, tf.nest.map_structure(tf.constant, features),
                 tf.constant(labels), mode, session_config)
    return emg.global_batch_ops(graph)


def _known_nets():
  return [n for n in sorted(NETS) if n in nets_factory.NETWORK_NAMES]


@pytest.mark.parametrize("name,dense_labels", [
    (n, False) for n in _known_nets()] + [("mlp", True)])
def test_nets_gather_nothing(name, dense_labels, session_config):
  size = NETS[name]
  images = np.random.RandomState(0).rand(5, size, size, 3).astype(np.float32)
  if name == "mlp":
    images = images.reshape(5, -1)[:, :64]
  labels = np.array([0, 1, 2, 1, 0], np.int64)
  found = _rewrites(_net_model_fn(name, dense_labels), images, labels, TRAIN,
                    session_config)
  assert [r for r in found if r.gathered] == []
  assert sum(r.statistics for r in found) == 0, found


@pytest.mark.parametrize("mode", [TRAIN, EVAL])
def test_bert_like_gathers_nothing(mode, session_config):
  features = bert_like.features(5)
  found = _rewrites(bert_like.model_fn, features, features["label_ids"],
                    mode, session_config)
  assert [r for r in found if r.gathered] == [], found


def _batch_norm_model_fn(layer):
  def model_fn(features, labels, mode):
    normed = layer(features)
    loss = tf.reduce_mean(tf.square(tf1.layers.dense(normed, 1) - labels))
    optimizer = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
    with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
      train_op = optimizer.minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn


BATCH_NORMS = {
    "tf1_layers": lambda x: tf1.layers.batch_normalization(x, training=True),
    "keras": lambda x: tf.keras.layers.BatchNormalization()(x, training=True),
}


@pytest.mark.parametrize("name", sorted(BATCH_NORMS))
def test_batch_norm_layers_stay_per_shard(name, session_config):
  """Without `sync_batch_norm`, a batch-norm layer's statistics (2-D: its
  moments, not the fused op) are its shard's, as its one warning says: the
  normalization and moving averages built from them are not rewritten."""
  x = np.random.RandomState(0).rand(5, 3).astype(np.float32)
  found = _rewrites(_batch_norm_model_fn(BATCH_NORMS[name]), x, x[:, :1],
                    TRAIN, session_config)
  assert found == []
