"""Property-based tests of the splitting (hypothesis).

For random nested structures, global batch sizes 0-64 and 1-8 towers: the
shards concatenate back to the input, shard sizes differ by at most one, and
the "mean" loss weights sum to 1 whenever the batch is not empty.
"""

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import numpy as np
import tensorflow as tf

from estimator_multigpu.graph import splitting

tf1 = tf.compat.v1

trailing_shapes = st.lists(st.integers(1, 3), max_size=2)
leaf_shapes = st.lists(trailing_shapes, min_size=1, max_size=4)
KINDS = ("flat", "dict", "nested")


def build_structure(kind, shapes, batch, rng):
  arrays = [rng.randn(batch, *shape).astype(np.float32) for shape in shapes]
  if kind == "flat":
    return arrays[0]
  if kind == "dict":
    return {f"k{i}": a for i, a in enumerate(arrays)}
  return {"a": (arrays[0], {"b": arrays[1:]})}


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(KINDS), shapes=leaf_shapes,
       batch=st.integers(0, 64), towers=st.integers(1, 8),
       dynamic=st.booleans(), seed=st.integers(0, 2**16))
def test_shards_concatenate_back_and_are_balanced(kind, shapes, batch, towers,
                                                  dynamic, seed):
  structure = build_structure(kind, shapes, batch, np.random.RandomState(seed))
  with tf.Graph().as_default():
    feed = {}

    def to_tensor(array):
      if not dynamic:
        return tf.constant(array)
      holder = tf1.placeholder(tf.float32, [None, *array.shape[1:]])
      feed[holder] = array
      return holder

    split = splitting.split_batch(tf.nest.map_structure(to_tensor, structure),
                                  None, towers)
    weights = [split.loss_weight(i, "mean") for i in range(towers)]
    # Static sizes and weights are Python numbers; only tensors are fetched.
    fetch = lambda x: x if isinstance(x, (int, float)) else session.run(x, feed)
    with tf1.Session() as session:
      shards = session.run([s[0] for s in split.shards], feed)
      sizes = [fetch(size) for size in split.sizes]
      weights = [fetch(weight) for weight in weights]
  rebuilt = tf.nest.map_structure(lambda *pieces: np.concatenate(pieces),
                                  *shards)
  tf.nest.map_structure(np.testing.assert_array_equal, rebuilt, structure)
  assert sum(sizes) == batch and max(sizes) - min(sizes) <= 1
  assert list(sizes) == sorted(sizes, reverse=True)  # extras go first.
  if batch:
    np.testing.assert_allclose(sum(weights), 1.0, rtol=1e-6)
  else:
    assert sum(weights) == 0.0
