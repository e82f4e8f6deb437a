"""`multi_gpu(..., sync_batch_norm=True)`: batch-norm nets train like one device.

Each model is conv or dense -> batch norm -> relu -> dense -> softmax cross
entropy, trained 3 Momentum steps. With the option, every variable (moving
mean and variance, Momentum slots, global_step included) after N towers
equals the unwrapped model_fn on one device on the whole batch within 1e-4
(measured: at most 1.4e-6, float32 rounding; the float64 gradient test of
`cross_tower_moments` below agrees with the numpy formula to 1e-10). Without
the option the towers normalize their own shards and the results differ by
more than 1e-3, so the comparison has teeth.

Initial weights are constants (np.linspace), so both runs start equal.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf
import tf_slim as slim

import estimator_multigpu as emg
from estimator_multigpu import collectives
from estimator_multigpu import slim_compat
from estimator_multigpu.cross_tower import moments
from estimator_multigpu.cross_tower import sync_batch_norm

import harness

tf1 = tf.compat.v1
TRAIN = tf.estimator.ModeKeys.TRAIN
STEPS = 3
TOLERANCE = 1e-4
CLASSES = 3
slim_compat.apply_all()  # The unwrapped reference runs use tf-slim too.


def _init(shape):
  size = int(np.prod(shape))
  values = np.sin(np.arange(size, dtype=np.float64) * 1.7).reshape(shape)
  return tf.constant_initializer(0.5 * values)


def _features(x, rank, layers):
  """The layer before batch norm: a 3x3 conv (rank 4) or a dense layer."""
  if rank == 4:
    shape = [3, 3, x.shape[-1], 4]
    if layers == "slim":
      return slim.conv2d(x, 4, 3, activation_fn=None, scope="conv",
                         weights_initializer=_init(shape))
    return tf1.layers.conv2d(x, 4, 3, padding="same", name="conv",
                             kernel_initializer=_init(shape))
  shape = [x.shape[-1], 5]
  if layers == "slim":
    return slim.fully_connected(x, 5, activation_fn=None, scope="fc",
                                weights_initializer=_init(shape))
  return tf1.layers.dense(x, 5, name="fc", kernel_initializer=_init(shape))


def _batch_norm(h, kind, training):
  if kind == "tf1":
    return tf1.layers.batch_normalization(h, training=training, momentum=0.9,
                                          name="bn")
  if kind == "tf1_class_nonfused":
    return tf1.layers.BatchNormalization(momentum=0.9, fused=False,
                                         name="bn")(h, training=training)
  if kind == "keras":
    layer = tf.keras.layers.BatchNormalization(momentum=0.9, name="bn")
    out = layer(h, training=training)
    for update in layer.updates:  # Keras layers leave UPDATE_OPS alone.
      tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS, update)
    return out
  fused = {"slim": None, "slim_nonfused": False, "slim_zero_debias": True,
           "slim_manual_moments": False}[kind]
  return slim.batch_norm(h, is_training=training, decay=0.9, scale=True,
                         fused=fused, scope="bn",
                         zero_debias_moving_mean="zero_debias" in kind
                         or "manual" in kind)


def make_model_fn(kind, rank):
  """A model_fn with one batch-norm layer of `kind` on rank-`rank` inputs."""
  layers = "slim" if kind.startswith("slim") else "tf1"

  def model_fn(features, labels, mode):
    training = mode == TRAIN
    h = _batch_norm(_features(features, rank, layers), kind, training)
    h = tf.reshape(tf.nn.relu(h), [-1, int(np.prod(h.shape[1:]))])
    logits = tf1.layers.dense(h, CLASSES, name="logits",
                              kernel_initializer=_init([h.shape[-1], CLASSES]))
    if mode == tf.estimator.ModeKeys.PREDICT:
      return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    if not training:
      return tf.estimator.EstimatorSpec(mode, loss=loss)
    opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.1, 0.9))
    with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
      train_op = opt.minimize(loss, tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn


def make_data(rank, batch, dtype=np.float32):
  rng = np.random.RandomState(batch)
  shape = [batch, 6] if rank == 2 else [batch, 3, 3, 2]
  x = rng.normal(5.0, 1.0, size=shape).astype(dtype)
  y = rng.randint(0, CLASSES, size=[batch]).astype(np.int32)
  return x, y


def max_difference(expected, actual):
  assert sorted(expected) == sorted(actual)
  return max(float(np.max(np.abs(expected[k] - actual[k]), initial=0.0))
             for k in expected)


_REFERENCE = {}


def reference(kind, rank, batch):
  """The unwrapped model_fn on one device (cached)."""
  if (kind, rank, batch) not in _REFERENCE:
    x, y = make_data(rank, batch)
    values, _ = harness.train(make_model_fn(kind, rank), x, y, STEPS,
                              _config())
    _REFERENCE[(kind, rank, batch)] = values
  return _REFERENCE[(kind, rank, batch)]


def _config():
  return emg.make_session_config(num_cpus=4)


def train_towers(kind, rank, batch, towers, dynamic=False, sync=True):
  x, y = make_data(rank, batch)
  values, _ = harness.train(make_model_fn(kind, rank), x, y, STEPS, _config(),
                            num_towers=towers, dynamic_batch=dynamic,
                            sync_batch_norm=sync)
  return values


# (towers, global batch, batch size known only at run time): divisible, not
# divisible (with run-time shard weights), smaller than the tower count (an
# empty shard, static and at run time), four uneven towers.
CASES = [(2, 8, False), (3, 7, True), (3, 2, False), (3, 2, True),
         (4, 7, False)]
# slim: 4-D default (the core layer's fused path), 2-D default (slim's own
# fused op), fused=False (the core layer's moments); tf1.layers 2-D.
KINDS = [("slim", 4), ("slim", 2), ("slim_nonfused", 4), ("tf1", 2)]


@pytest.mark.parametrize("towers,batch,dynamic", CASES)
@pytest.mark.parametrize("kind,rank", KINDS)
def test_sync_towers_match_one_device(kind, rank, towers, batch, dynamic):
  expected = reference(kind, rank, batch)
  actual = train_towers(kind, rank, batch, towers, dynamic)
  assert any(name.endswith("moving_variance") for name in expected)
  assert max_difference(expected, actual) < TOLERANCE


def test_one_tower_is_the_unwrapped_model_fn():
  expected = reference("slim", 4, 8)
  actual = train_towers("slim", 4, 8, 1)
  assert max_difference(expected, actual) == 0.0


@pytest.mark.parametrize("kind,rank", [
    ("slim_zero_debias", 4), ("slim_manual_moments", 4), ("tf1", 4),
    ("tf1_class_nonfused", 4), ("keras", 4), ("keras", 2)])
def test_other_batch_norm_paths(kind, rank):
  expected = reference(kind, rank, 7)
  actual = train_towers(kind, rank, 7, 3, dynamic=True)
  assert max_difference(expected, actual) < TOLERANCE


@pytest.mark.parametrize("kind,rank", [("slim", 4), ("tf1", 2)])
def test_without_sync_towers_differ(kind, rank):
  expected = reference(kind, rank, 8)
  actual = train_towers(kind, rank, 8, 2, sync=False)
  assert max_difference(expected, actual) > 1e-3


def _graph_op_types(model_fn, mode, towers, features, labels, sync=True):
  with tf.Graph().as_default() as graph:
    tf1.train.get_or_create_global_step()
    fn = emg.multi_gpu(model_fn, devices=harness.cpu_devices(towers),
                       sync_batch_norm=sync)
    harness.call(fn, tf.constant(features), tf.constant(labels), mode,
                 _config())
  return {op.type for op in graph.get_operations()}


@pytest.mark.parametrize("mode", [tf.estimator.ModeKeys.EVAL,
                                  tf.estimator.ModeKeys.PREDICT])
def test_eval_and_predict_build_no_collectives(mode):
  x, y = make_data(4, 6)
  types = _graph_op_types(make_model_fn("slim", 4), mode, 2, x, y)
  assert not [t for t in types if t.startswith("Collective")]


def test_one_tower_builds_no_collectives():
  x, y = make_data(4, 6)
  types = _graph_op_types(make_model_fn("slim", 4), TRAIN, 1, x, y)
  assert not [t for t in types if t.startswith("Collective")]
  assert not sync_batch_norm.is_installed()  # patches removed after towers.


def test_train_builds_one_all_reduce_per_layer_and_direction():
  x, y = make_data(4, 6)
  with tf.Graph().as_default() as graph:
    tf1.train.get_or_create_global_step()
    fn = emg.multi_gpu(make_model_fn("slim", 4), devices=harness.cpu_devices(3),
                       sync_batch_norm=True)
    harness.call(fn, tf.constant(x), tf.constant(y), TRAIN, _config())
  reduces = [op for op in graph.get_operations()
             if op.type == "CollectiveReduceV2"]
  # 1 layer x 3 towers x (forward + backward).
  assert len(reduces) == 6
  assert sorted(op.device for op in reduces) == sorted(
      [f"/device:CPU:{i}" for i in range(3)] * 2)


def test_export_holds_no_collectives(tmp_path):
  x, y = make_data(4, 8)
  config = tf.estimator.RunConfig(model_dir=str(tmp_path / "model"),
                                  session_config=_config())
  fn = emg.multi_gpu(make_model_fn("slim", 4), devices=harness.cpu_devices(2),
                     sync_batch_norm=True)
  estimator = tf.estimator.Estimator(fn, config=config)
  estimator.train(lambda: tf.data.Dataset.from_tensors((x, y)).repeat(),
                  steps=2)
  export_dir = estimator.export_saved_model(str(tmp_path / "export"),
                                            _serving_input)
  with tf.Graph().as_default() as graph, tf1.Session() as session:
    tf1.saved_model.load(session, ["serve"], export_dir)
    types = {op.type for op in graph.get_operations()}
  assert not [t for t in types if t.startswith("Collective")]


def _serving_input():
  x = tf1.placeholder(tf.float32, [None, 3, 3, 2], name="x")
  return tf.estimator.export.TensorServingInputReceiver(x, {"x": x})


def test_option_must_be_bool():
  with pytest.raises(TypeError, match="sync_batch_norm"):
    emg.multi_gpu(make_model_fn("slim", 4), sync_batch_norm="yes")


# cross_tower_moments directly, against numpy.

def _tower_moments(x_value, towers, axes):
  """Builds cross_tower_moments of each tower's shard in a fresh graph."""
  graph = tf.Graph()
  with graph.as_default():
    shards = np.array_split(x_value, towers)
    group = collectives.Group(tuple(harness.cpu_devices(towers)))
    results = []
    for index, shard in enumerate(shards):
      with tf.device(group.devices[index]), \
          moments.tower_context(index, group):
        x = tf.constant(shard)
        results.append((x,) + tuple(emg.cross_tower_moments(x, axes)))
  return graph, results


@pytest.mark.parametrize("towers,batch", [(1, 5), (2, 6), (3, 7), (4, 3)])
@pytest.mark.parametrize("loc", [5.0, 1000.0])
def test_cross_tower_moments_match_numpy(towers, batch, loc):
  x_value = np.random.RandomState(0).normal(loc, 1.0, [batch, 4, 5])
  x_value = x_value.astype(np.float32)
  graph, results = _tower_moments(x_value, towers, [0, 1])
  with tf1.Session(graph=graph, config=_config()) as session:
    got = session.run([r[1:] for r in results])
  x64 = x_value.astype(np.float64)
  for mean, variance in got:  # every tower gets the global moments.
    np.testing.assert_allclose(mean, x64.mean(axis=(0, 1)), rtol=1e-6)
    np.testing.assert_allclose(variance, x64.var(axis=(0, 1)), rtol=1e-5)


@pytest.mark.parametrize("towers,batch", [(2, 6), (3, 7), (3, 2)])
def test_cross_tower_moments_gradients(towers, batch):
  """Σ over towers of each tower's objective/N equals the one-device one."""
  rng = np.random.RandomState(1)
  x_value = rng.normal(5.0, 1.0, [batch, 3])
  a, b = rng.normal(size=[3]), rng.normal(size=[3])

  def objective(mean, variance):
    return tf.reduce_sum(a * mean + b * tf.sqrt(variance + 0.1)
                         + mean * variance)

  graph, results = _tower_moments(x_value, towers, [0])
  with graph.as_default():
    grads = tf.concat([tf.gradients(objective(m, v) / towers, x)[0]
                       for x, m, v in results], axis=0)
  with tf1.Session(graph=graph, config=_config()) as session:
    got = session.run(grads)
  # numpy: d/dxₖ of mean is 1/n, of the biased variance 2(xₖ - mean)/n.
  mean, var = x_value.mean(axis=0), x_value.var(axis=0)
  d_mean = a + var
  d_var = b / (2 * np.sqrt(var + 0.1)) + mean
  want = d_mean / batch + d_var * 2 * (x_value - mean) / batch
  np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_keys_unique_per_layer_graph_and_direction():
  keys = []
  for _ in range(2):  # two graphs in one process, e.g. train then train.
    graph, results = _tower_moments(np.ones([4, 3], np.float32), 2, [0])
    with graph.as_default():
      tf.gradients([m for _, m, _ in results], [x for x, _, _ in results])
    by_key = {}
    for op in graph.get_operations():
      if op.type == "CollectiveReduceV2":
        key = tf.make_ndarray(op.inputs[3].op.get_attr("value")).item()
        by_key.setdefault(key, []).append(op.device)
    assert len(by_key) == 2  # one forward, one backward key.
    assert all(sorted(d) == harness.cpu_devices(2) or sorted(d) == [
        "/device:CPU:0", "/device:CPU:1"] for d in by_key.values())
    keys.append(set(by_key))
  assert not keys[0] & keys[1]


def test_towers_building_different_layers_is_an_error():
  with tf.Graph().as_default():
    group = collectives.Group(tuple(harness.cpu_devices(2)))
    with pytest.raises(ValueError, match="1 of 2 towers"):
      for index in range(2):
        with tf.device(group.devices[index]), \
            sync_batch_norm.tower_scope(index, group):
          if index == 0:
            emg.cross_tower_moments(tf.ones([2, 3]), [0])


def make_tf_gradients_model_fn():
  """The slim 2-D model, its gradients from `tf.gradients` (BERT style):
  TowerOptimizer weights them when they are applied, so the backward
  all-reduce must weight each tower's share itself."""
  def model_fn(features, labels, mode):
    h = _batch_norm(_features(features, 2, "slim"), "slim", True)
    logits = tf1.layers.dense(tf.nn.relu(h), CLASSES, name="logits",
                              kernel_initializer=_init([5, CLASSES]))
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    variables = tf1.trainable_variables()
    grads = tf.gradients(loss, variables)
    opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.1, 0.9))
    with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
      train_op = opt.apply_gradients(zip(grads, variables),
                                     tf1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn


@pytest.mark.parametrize("towers,batch,dynamic", [(3, 7, False), (3, 7, True),
                                                   (3, 2, False)])
def test_gradients_from_tf_gradients_are_exact_too(towers, batch, dynamic):
  x, y = make_data(2, batch)
  expected, _ = harness.train(make_tf_gradients_model_fn(), x, y, STEPS,
                              _config())
  actual, _ = harness.train(make_tf_gradients_model_fn(), x, y, STEPS,
                            _config(), num_towers=towers,
                            dynamic_batch=dynamic, sync_batch_norm=True)
  assert max_difference(expected, actual) < TOLERANCE


@pytest.mark.parametrize("kind", ["slim", "tf1", "keras"])
def test_a_metric_after_synchronized_batch_norm_is_not_warned(kind, caplog):
  """The moments center each shard on its own mean, a shift the sums over
  the towers undo: what follows the layer is the global batch's, so a
  metric of it (built in TRAIN too) is not a shard statistic's."""
  x, y = make_data(2, 7)
  base = make_model_fn(kind, 2)

  def model_fn(features, labels, mode):
    spec = base(features, labels, mode)
    logits = tf1.get_default_graph().get_tensor_by_name("logits/BiasAdd:0")
    return spec._replace(eval_metric_ops={"acc": tf1.metrics.accuracy(
        labels, tf.argmax(logits, 1))})

  caplog.set_level(logging.WARNING, logger="absl")
  _graph_op_types(model_fn, TRAIN, 2, x, y)
  assert "eval metric 'acc'" not in caplog.text
