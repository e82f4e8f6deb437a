"""Model_fns written with raw ops that couple the examples of a batch, each in
two spellings; shared by the global-batch tests."""

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
TAU = 0.5


def encoder(x, name="enc"):
  """A two-layer projection; variables enc/h/*, enc/proj/*."""
  with tf1.variable_scope(name, reuse=tf1.AUTO_REUSE):
    h = tf1.layers.dense(x, 6, tf.nn.tanh, name="h",
                         kernel_initializer=tf1.glorot_uniform_initializer(3))
    return tf1.layers.dense(h, 4, name="proj",
                            kernel_initializer=tf1.glorot_uniform_initializer(4))


def nt_xent_matmul(z1, z2, labels):
  del labels
  z1, z2 = tf.nn.l2_normalize(z1, 1), tf.nn.l2_normalize(z2, 1)
  n = tf.shape(z1)[0]
  z = tf.concat([z1, z2], 0)
  sim = tf.matmul(z, z, transpose_b=True) / TAU - 1e9 * tf.eye(2 * n)
  targets = tf.concat([tf.range(n, 2 * n), tf.range(0, n)], 0)
  return tf.reduce_mean(
      tf.nn.sparse_softmax_cross_entropy_with_logits(targets, sim))


def nt_xent_einsum(z1, z2, labels):
  """CLIP-style: logits between the two views, one-hot targets of positions."""
  del labels
  z1 = z1 / tf.norm(z1, axis=1, keepdims=True)
  z2 = z2 / tf.norm(z2, axis=1, keepdims=True)
  logits = tf.einsum("ik,jk->ij", z1, z2) / TAU
  targets = tf.one_hot(tf.range(tf.shape(logits)[0]), tf.shape(logits)[1])
  return tf.reduce_mean(
      tf.nn.softmax_cross_entropy_with_logits(targets, logits))


def npairs_contrib(z1, z2, labels):
  """tf.contrib.losses.metric_learning.npairs_loss."""
  reg = tf.reduce_mean(tf.reduce_sum(tf.square(z1), 1)) + tf.reduce_mean(
      tf.reduce_sum(tf.square(z2), 1))
  sim = tf.matmul(z1, z2, transpose_b=True)
  labels = tf.reshape(labels, [-1, 1])
  same = tf.cast(tf.equal(labels, tf.transpose(labels)), tf.float32)
  same /= tf.reduce_sum(same, 1, keepdims=True)
  xent = tf.nn.softmax_cross_entropy_with_logits(logits=sim, labels=same)
  return tf.reduce_mean(xent) + 0.0005 * reg


def npairs_broadcast(z1, z2, labels):
  """The same loss with broadcasting and a hand-written log-softmax."""
  sim = tf.einsum("id,jd->ij", z1, z2)
  same = tf.cast(tf.equal(labels[:, None], labels[None, :]), tf.float32)
  same = same / tf.reduce_sum(same, axis=-1, keepdims=True)
  log_p = sim - tf.reduce_logsumexp(sim, axis=1, keepdims=True)
  return -tf.reduce_mean(tf.reduce_sum(same * log_p, 1))


def advantage_moments(z1, z2, labels):
  """Policy-gradient advantage normalization: (a - mean) / std."""
  del labels
  adv = tf.reduce_sum(z1 * z2, 1)
  adv = (adv - tf.reduce_mean(adv)) / (tf.math.reduce_std(adv) + 1e-6)
  return tf.reduce_mean(tf.square(adv - tf.reduce_sum(z1, 1)))


def centered_by_hand(z1, z2, labels):
  del labels
  adv = tf.reduce_sum(z1 * z2, 1)
  mean, var = tf.nn.moments(adv, [0])
  adv = (adv - mean) * tf.math.rsqrt(var + 1e-2)
  return tf.reduce_mean(tf.square(adv - tf.reduce_sum(z1, 1)))


def batch_norm_moments(z1, z2, labels):
  """Batch norm written with tf.nn.moments (not a layer)."""
  del z2
  mean, variance = tf.nn.moments(z1, [0])
  h = tf.nn.batch_normalization(z1, mean, variance, 0.1, 1.2, 1e-3)
  return tf.reduce_mean(tf.square(h - tf.cast(labels[:, None], tf.float32)))


def batch_norm_by_hand(z1, z2, labels):
  del z2
  mean = tf.reduce_mean(z1, axis=0, keepdims=True)
  variance = tf.reduce_mean(tf.square(z1 - mean), axis=0, keepdims=True)
  h = (z1 - mean) / tf.sqrt(variance + 1e-3)
  return tf.reduce_mean(tf.square(h - tf.cast(labels[:, None], tf.float32)))


def sum_over_count(z1, z2, labels):
  """A loss that is a sum over a count of the batch, by hand."""
  del labels
  per = tf.reduce_sum(tf.square(z1 - z2), 1)
  return tf.reduce_sum(per) / tf.cast(tf.shape(z1)[0], tf.float32)


def foldl_statistic(z1, z2, labels):
  """tf.foldl of the batch: a running sum, centered rows."""
  del labels
  total = tf.foldl(lambda acc, row: acc + row, z1,
                   initializer=tf.zeros([4]))
  centered = z2 - total / tf.cast(tf.shape(z1)[0], tf.float32)
  return tf.reduce_mean(tf.square(centered))


def map_fn_statistic(z1, z2, labels):
  """tf.map_fn per row, then the batch's max."""
  del labels
  norms = tf.map_fn(lambda row: tf.reduce_sum(tf.square(row)), z1)
  return tf.reduce_mean(tf.reduce_sum(z2, 1) * norms / tf.reduce_max(norms))


def reverse_roll(z1, z2, labels):
  """Pairs each example with its neighbour in the batch."""
  del labels
  return tf.reduce_mean(tf.square(z1 - tf.reverse(z2, [0]))) + tf.reduce_mean(
      z1 * tf.roll(z2, 1, 0))


def sort_top_k(z1, z2, labels):
  """Hard-example mining: the largest losses over the batch."""
  del labels
  per = tf.reduce_sum(tf.square(z1 - z2), 1)
  hardest, _ = tf.nn.top_k(per, k=tf.minimum(2, tf.shape(per)[0]))
  return tf.reduce_mean(hardest) + 0.1 * tf.reduce_mean(
      tf.sort(per)[:1])


def argmax_batch(z1, z2, labels):
  """The example of the batch nearest to each projection axis."""
  del labels
  index = tf.argmax(z1, axis=0)
  return tf.reduce_mean(tf.square(tf.gather(z2, index) - 1.0)) + (
      tf.reduce_mean(z1))


def py_func_statistic(z1, z2, labels):
  """tf.py_func returning a batch statistic (np.std)."""
  del labels
  std = tf1.py_func(lambda a: np.float32(np.std(a)), [z1], tf.float32)
  std.set_shape([])
  return tf.reduce_mean(tf.square(z2)) * (1.0 + tf.stop_gradient(std))


def numpy_function_rows(z1, z2, labels):
  """tf.numpy_function of per-example values, centered on the batch."""
  del labels
  shifted = tf.numpy_function(lambda a: (a - a.mean(0)).astype(np.float32),
                              [z1], tf.float32)
  shifted.set_shape(z1.shape)
  return tf.reduce_mean(tf.square(z2 - tf.stop_gradient(shifted)))


TRAIN_LOSSES = {
    "nt_xent_matmul": nt_xent_matmul, "nt_xent_einsum": nt_xent_einsum,
    "npairs_contrib": npairs_contrib, "npairs_broadcast": npairs_broadcast,
    "advantage_moments": advantage_moments,
    "centered_by_hand": centered_by_hand,
    "batch_norm_moments": batch_norm_moments,
    "batch_norm_by_hand": batch_norm_by_hand,
    "sum_over_count": sum_over_count, "foldl_statistic": foldl_statistic,
    "map_fn_statistic": map_fn_statistic, "reverse_roll": reverse_roll,
    "sort_top_k": sort_top_k, "argmax_batch": argmax_batch,
    "py_func_statistic": py_func_statistic,
    "numpy_function_rows": numpy_function_rows,
}


def train_model_fn(loss_of, optimizer_wrapper=None):
  def model_fn(features, labels, mode):
    z1 = encoder(features["v1"])
    z2 = encoder(features["v2"])
    loss = loss_of(z1, z2, labels)
    optimizer = tf1.train.MomentumOptimizer(0.2, 0.9)
    if optimizer_wrapper:
      optimizer = optimizer_wrapper(optimizer)
    train_op = optimizer.minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn


def data(batch, seed=5):
  rng = np.random.RandomState(seed)
  v1 = rng.randn(batch, 5).astype(np.float32)
  v2 = (v1 + 0.3 * rng.randn(batch, 5)).astype(np.float32)
  labels = rng.randint(0, 3, size=batch).astype(np.int64)
  return {"v1": v1, "v2": v2}, labels
