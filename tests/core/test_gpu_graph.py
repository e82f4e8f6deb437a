"""The default on GPU towers, read off the whole training graph.

This machine may have no GPU: the graph is only built (as Estimator would,
with soft placement), never run; `devices.num_visible_gpus` is made to see
8 GPUs so `/gpu:k` towers are accepted. With two or more GPU towers the
default (`variable_update="auto"`) is a copy per tower and one packed NCCL
all-reduce (`communication_hint="nccl"`) launched in the same order on every
GPU; the host only on request. `tests/gpu/` runs it on real GPUs.
"""

import pytest
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu import devices as devices_lib

import harness

tf1 = tf.compat.v1
X, Y = harness.linear_data(7)
COLLECTIVES = ("CollectiveReduceV2", "CollectiveGatherV2")


def two_layer_model_fn(features, labels, mode):
  """Two dense layers, two optimizers (one per layer), as a GAN has."""
  h = tf1.layers.dense(features, 4, tf.nn.tanh, name="hidden")
  pred = tf.cast(tf1.layers.dense(h, 2, name="out"), tf.float32)
  loss = tf.reduce_mean(tf.square(pred - labels))
  step = tf1.train.get_global_step()
  first = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.1, 0.9))
  second = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
  train_op = tf.group(
      first.minimize(loss, step, var_list=tf1.trainable_variables("hidden")),
      second.minimize(loss, var_list=tf1.trainable_variables("out")))
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


@pytest.fixture(name="gpu_graph")
def fixture_gpu_graph(monkeypatch):
  """Builds the TRAIN graph on `num_towers` GPU towers; returns it."""
  monkeypatch.setattr(devices_lib, "num_visible_gpus", lambda: 8)

  def build(num_towers, **options):
    fn = emg.multi_gpu(two_layer_model_fn,
                       devices=[f"/gpu:{i}" for i in range(num_towers)],
                       **options)
    config = tf.estimator.RunConfig(session_config=tf1.ConfigProto(
        allow_soft_placement=True))
    graph = tf.Graph()
    with graph.as_default():
      tf1.train.get_or_create_global_step()
      fn(tf.constant(X), tf.constant(Y), "train", {}, config)
    return graph

  return build


def collectives_by_device(graph) -> dict:
  """Per device, its gradient collectives in creation order (not the global
  batch's exchanges of a model_fn's statistics: `cross_tower_*` scopes)."""
  found: dict = {}
  for op in graph.get_operations():
    if op.type in COLLECTIVES and "cross_tower_" not in op.name:
      found.setdefault(op.device, []).append(op)
  return found


def runs_after(op) -> set:
  """The ops `op` waits for by control edges, on it or on its key inputs
  (TensorFlow moves a control dependency onto inputs created under it)."""
  waits = set(op.control_inputs)
  for tensor in op.inputs:
    waits.update(tensor.op.control_inputs)
  return waits


def instance_key(op) -> int:
  return int(tf.get_static_value(op.inputs[3]))


@pytest.mark.parametrize("num_towers", [2, 3])
def test_default_is_one_packed_nccl_all_reduce_per_gpu(gpu_graph,
                                                       num_towers):
  graph = gpu_graph(num_towers)
  found = collectives_by_device(graph)
  assert sorted(found) == [f"/device:GPU:{i}" for i in range(num_towers)]
  for ops in found.values():
    # One packed buffer per optimizer call (two calls), NCCL.
    assert [op.type for op in ops] == ["CollectiveReduceV2"] * 2
    assert {op.get_attr("communication_hint") for op in ops} == {b"nccl"}
    assert [op.inputs[0].op.type for op in ops] == ["ConcatV2"] * 2
  with graph.as_default():
    copies = [v for v in tf1.local_variables()
              if v.op.name.startswith("tower_1/") and "kernel" in v.op.name]
  assert copies and all("GPU:1" in v.device for v in copies)


def test_every_gpu_launches_its_collectives_in_one_order(gpu_graph):
  """Unpacked: one collective per gradient, chained on each GPU (across
  both optimizer calls), with the same instance keys in the same order."""
  found = collectives_by_device(gpu_graph(3, gradient_packing_bytes=0))
  orders = [[instance_key(op) for op in ops] for ops in found.values()]
  assert len(orders[0]) == 4 and all(o == orders[0] for o in orders)
  for ops in found.values():
    for before, after in zip(ops, ops[1:]):
      assert before in runs_after(after)


@pytest.mark.parametrize("options", [
    {"accumulate_steps": 2}, {"mixed_precision": "float16"},
    {"mixed_precision": "bfloat16"}, {"clip_gradients_by_norm": 1.0},
    {"sync_batch_norm": True}])
def test_options_keep_the_gpu_all_reduce(gpu_graph, options):
  found = collectives_by_device(gpu_graph(2, **options))
  hints = {op.get_attr("communication_hint")
           for ops in found.values() for op in ops}
  assert len(found) == 2 and hints == {b"nccl"}


@pytest.mark.parametrize("options", [{"variable_update": "shared"},
                                     {"synchronization": "async"}])
def test_the_host_on_request(gpu_graph, options):
  graph = gpu_graph(2, **options)
  assert not collectives_by_device(graph)
  with graph.as_default():
    kernels = [v for v in tf1.global_variables() if "kernel" in v.op.name]
  assert kernels and all("CPU:0" in v.device for v in kernels)


def test_cpu_towers_keep_shared_variables(session_config):
  fn = emg.multi_gpu(two_layer_model_fn, devices=harness.cpu_devices(2))
  with tf.Graph().as_default() as graph:
    tf1.train.get_or_create_global_step()
    fn(tf.constant(X), tf.constant(Y), "train", {},
       harness.config_for(session_config))
  assert not collectives_by_device(graph)


def test_a_tf2_canned_estimator_keeps_shared_variables_on_gpus(monkeypatch):
  # Its Keras optimizers apply once per step; "auto" must not give each GPU
  # a copy (which would apply them once per tower): no collective, one set
  # of variables, the canned optimizer's slots once.
  monkeypatch.setattr(devices_lib, "num_visible_gpus", lambda: 8)
  columns = [tf.feature_column.numeric_column("x", shape=[X.shape[1]])]
  canned = tf.estimator.DNNClassifier(hidden_units=[3],
                                      feature_columns=columns)
  fn = emg.multi_gpu(canned.model_fn, devices=["/gpu:0", "/gpu:1"])
  config = tf.estimator.RunConfig(session_config=tf1.ConfigProto(
      allow_soft_placement=True))
  graph = tf.Graph()
  with graph.as_default():
    tf1.train.get_or_create_global_step()
    fn({"x": tf.constant(X)}, tf.constant([[0], [1], [0], [1], [1], [0],
                                           [1]]), "train", {}, config)
    names = [v.op.name for v in tf1.global_variables()]
  assert not collectives_by_device(graph)
  assert not [n for n in names if n.startswith("tower_")]
  assert names.count("dnn/hiddenlayer_0/kernel/part_0/Adagrad") <= 1
