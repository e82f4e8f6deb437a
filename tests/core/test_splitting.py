"""The global batch is cut into contiguous, in-order, near-equal shards."""

import numpy as np
import pytest
import tensorflow as tf

from estimator_multigpu.graph import splitting

tf1 = tf.compat.v1


@pytest.mark.parametrize("batch,towers,sizes", [
    (12, 4, [3, 3, 3, 3]), (7, 3, [3, 2, 2]), (2, 4, [1, 1, 0, 0]),
    (0, 2, [0, 0]), (5, 1, [5])])
def test_shard_sizes(batch, towers, sizes):
  assert splitting.shard_sizes(batch, towers) == sizes


def run(structure):
  with tf1.Session() as session:
    return session.run(structure)


@pytest.mark.parametrize("batch", [0, 1, 5, 9])
def test_dynamic_sizes_match_static_ones(batch):
  with tf.Graph().as_default():
    n = tf1.placeholder(tf.int32, [])
    sizes = splitting.shard_sizes(n, 4)
    with tf1.Session() as session:
      got = session.run(sizes, {n: batch})
  assert list(got) == splitting.shard_sizes(batch, 4)


def test_nested_structures_split_in_order():
  x = np.arange(14, dtype=np.float32).reshape(7, 2)
  ids = np.arange(7)
  with tf.Graph().as_default():
    split = splitting.split_batch(
        {"x": tf.constant(x), "pair": (tf.constant(ids), tf.constant(-ids))},
        tf.constant(ids * 10), 3)
    shards = run(split.shards)
  assert split.sizes == [3, 2, 2] and split.global_batch_size == 7
  np.testing.assert_array_equal(
      np.concatenate([s[0]["x"] for s in shards]), x)
  np.testing.assert_array_equal(shards[1][0]["pair"][1], [-3, -4])
  np.testing.assert_array_equal(shards[2][1], [50, 60])


def test_sparse_tensor_rows_restart_at_zero():
  dense = np.array([[1, 0, 0], [0, 2, 0], [0, 0, 3], [4, 0, 5], [0, 6, 0]],
                   np.float32)
  with tf.Graph().as_default():
    sparse = tf.sparse.from_dense(tf.constant(dense))
    split = splitting.split_batch(sparse, None, 2)
    pieces = run([tf.sparse.to_dense(s[0]) for s in split.shards])
  np.testing.assert_array_equal(pieces[0], dense[:3])
  np.testing.assert_array_equal(pieces[1], dense[3:])


def test_batch_unknown_until_run_time():
  x = np.arange(5, dtype=np.float32)
  with tf.Graph().as_default():
    holder = tf1.placeholder(tf.float32, [None])
    split = splitting.split_batch(holder, None, 4)
    with tf1.Session() as session:
      shards = session.run([s[0] for s in split.shards], {holder: x})
  assert not split.static
  assert [len(s) for s in shards] == [2, 1, 1, 1]
  np.testing.assert_array_equal(np.concatenate(shards), x)


def test_labels_none_stays_none():
  with tf.Graph().as_default():
    split = splitting.split_batch(tf.zeros([4, 2]), None, 2)
  assert [labels for _, labels in split.shards] == [None, None]
