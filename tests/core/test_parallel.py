"""make_parallel: outputs and gradients equal one device's, on 1-4 CPUs."""

import numpy as np
import pytest
import tensorflow as tf
import tf_slim as slim

import estimator_multigpu as emg

from nets import nets_factory

tf1 = tf.compat.v1

RNG = np.random.RandomState(0)
W0 = RNG.randn(3, 2).astype(np.float32)
B0 = RNG.randn(2).astype(np.float32)


def cpus(num_towers):
  return [f"/cpu:{k}" for k in range(num_towers)]


def tanh_layer(x):
  """y = tanh(x W + b), returned in a nested structure."""
  w = tf1.get_variable("w", initializer=W0)
  b = tf1.get_variable("b", initializer=B0)
  y = tf.tanh(tf.matmul(x, w) + b)
  return {"y": y, "parts": (2.0 * x, [tf.reduce_sum(y, axis=1)])}


def numpy_expected(x, c, d, e):
  """Outputs and gradients of L = Σ y·c + Σ rowsum(y)·d + Σ 2x·e."""
  y = np.tanh(x @ W0 + B0)
  dz = (c + d[:, None]) * (1.0 - y ** 2)  # dL/dy, times tanh' = 1 - y².
  grads = {"w": x.T @ dz, "b": dz.sum(axis=0), "x": dz @ W0.T + 2.0 * e}
  return {"y": y, "x2": 2.0 * x, "rowsum": y.sum(axis=1)}, grads


def run_tanh_layer(num_towers, batch, session_config, dynamic):
  """make_parallel(tanh_layer) on `batch` examples; outputs and gradients."""
  rng = np.random.RandomState(batch)
  arrays = [rng.randn(batch, 3), rng.randn(batch, 2), rng.randn(batch),
            rng.randn(batch, 3)]
  arrays = [a.astype(np.float32) for a in arrays]
  with tf.Graph().as_default():
    shapes = [[None if dynamic else batch] + list(a.shape[1:]) for a in arrays]
    x, c, d, e = [tf1.placeholder(tf.float32, s) for s in shapes]
    out = emg.make_parallel(tanh_layer, cpus(num_towers),
                            session_config=session_config, x=x)
    loss = (tf.reduce_sum(out["y"] * c) +
            tf.reduce_sum(out["parts"][1][0] * d) +
            tf.reduce_sum(out["parts"][0] * e))
    variables = {v.op.name: v for v in tf1.global_variables()}
    grads = dict(zip(["w", "b", "x"], tf1.gradients(
        loss, [variables["w"], variables["b"], x],
        colocate_gradients_with_ops=True)))
    with tf1.Session(config=session_config) as session:
      session.run(tf1.global_variables_initializer())
      got = session.run({"outputs": out, "grads": grads},
                        dict(zip([x, c, d, e], arrays)))
  return got, numpy_expected(*arrays), sorted(variables)


@pytest.mark.parametrize("num_towers", [1, 2, 3, 4])
@pytest.mark.parametrize("batch,dynamic", [(7, False), (2, False), (8, False),
                                           (5, True), (1, True)])
def test_outputs_and_gradients_equal_numpy(num_towers, batch, dynamic,
                                           session_config):
  got, (outputs, grads), names = run_tanh_layer(num_towers, batch,
                                                session_config, dynamic)
  assert names == ["b", "w"]  # created once, with the one-device names.
  np.testing.assert_allclose(got["outputs"]["y"], outputs["y"], atol=1e-5)
  np.testing.assert_allclose(got["outputs"]["parts"][0], outputs["x2"],
                             atol=1e-5)
  np.testing.assert_allclose(got["outputs"]["parts"][1][0],
                             outputs["rowsum"], atol=1e-5)
  for name, value in grads.items():
    np.testing.assert_allclose(got["grads"][name], value, atol=1e-5,
                               err_msg=name)


def layer_fn(kind):
  """fn(x) with one dense layer of `kind`, initialised to W0, B0."""
  kernel, bias = tf1.constant_initializer(W0), tf1.constant_initializer(B0)

  def fn(x):
    if kind == "keras":
      layer = tf.keras.layers.Dense(2, kernel_initializer=kernel,
                                    bias_initializer=bias, name="lin")
      return (layer(x),)
    if kind == "slim":
      return (slim.fully_connected(x, 2, activation_fn=None, scope="lin",
                                   weights_initializer=kernel,
                                   biases_initializer=bias),)
    return (tf1.layers.dense(x, 2, kernel_initializer=kernel,
                             bias_initializer=bias),)

  return fn


def outputs_and_gradients(fn, x_value, session_config, devices=None):
  """fn on one device (devices=None) or through make_parallel."""
  with tf.Graph().as_default():
    x = tf1.placeholder(tf.float32, [None, 3])
    out = fn(x) if devices is None else emg.make_parallel(
        fn, devices, session_config=session_config, x=x)
    variables = tf1.trainable_variables()
    grads = tf1.gradients(tf.reduce_sum(tf.square(out[0])), variables + [x],
                          colocate_gradients_with_ops=True)
    with tf1.Session(config=session_config) as session:
      session.run(tf1.global_variables_initializer())
      values = session.run([out, grads], {x: x_value})
  return values, sorted(v.op.name for v in variables)


@pytest.mark.parametrize("kind", ["tf1_layers", "keras", "slim"])
@pytest.mark.parametrize("num_towers", [2, 4])
def test_every_layer_kind_shares_variables(kind, num_towers, session_config):
  x_value = np.random.RandomState(1).randn(5, 3).astype(np.float32)
  (out, grads), names = outputs_and_gradients(
      layer_fn(kind), x_value, session_config, cpus(num_towers))
  (want_out, want_grads), want_names = outputs_and_gradients(
      layer_fn(kind), x_value, session_config)
  assert names == want_names and len(names) == 2
  np.testing.assert_allclose(out[0], want_out[0], atol=1e-5)
  for got, want in zip(grads, want_grads):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_tower_ops_and_their_gradients_run_on_the_tower_device(
    session_config):
  with tf.Graph().as_default() as graph:
    x = tf1.placeholder(tf.float32, [None, 3])
    out = emg.make_parallel(layer_fn("tf1_layers"), cpus(3),
                            session_config=session_config, x=x)
    tf1.gradients(tf.reduce_sum(out[0]), tf1.trainable_variables() + [x],
                  colocate_gradients_with_ops=True)
  for tower in (1, 2):
    ops = [op for op in graph.get_operations()
           if op.name.split("/")[:2] in (
               [f"tower_{tower}", "dense"], ["gradients", f"tower_{tower}"])
           and op.type != "ReadVariableOp"]  # reads sit with the variable.
    assert len(ops) >= 5
    assert {op.device for op in ops} == {f"/device:CPU:{tower}"}
  handles = [op for op in graph.get_operations() if op.type == "VarHandleOp"]
  assert {op.device for op in handles} == {"/device:CPU:0"}


def test_one_device_builds_the_plain_graph(session_config):
  with tf.Graph().as_default() as graph:
    x = tf1.placeholder(tf.float32, [None, 3])
    emg.make_parallel(layer_fn("tf1_layers"), ["/CPU:1"],
                      session_config=session_config, x=x)
  names = [op.name for op in graph.get_operations()]
  assert not [n for n in names if n.startswith(("split_batch", "tower_",
                                                "make_parallel"))]
  assert graph.get_operation_by_name("dense/MatMul").device == "/device:CPU:1"


def test_inference_of_a_trained_net_from_its_checkpoint(session_config,
                                                        tmp_path):
  images = np.random.RandomState(2).rand(6, 8, 8, 1).astype(np.float32)
  network = nets_factory.get_network_fn("mlp", num_classes=10)
  path = str(tmp_path / "model.ckpt")
  with tf.Graph().as_default():  # "training": one device, saved weights.
    probabilities = tf.nn.softmax(network(tf.constant(images))[0])
    with tf1.Session() as session:
      session.run(tf1.global_variables_initializer())
      want = session.run(probabilities)
      tf1.train.Saver().save(session, path)
  with tf.Graph().as_default():  # inference on 3 devices, any batch size.
    holder = tf1.placeholder(tf.float32, [None, 8, 8, 1])
    parallel = emg.make_parallel(
        lambda images: tf.nn.softmax(network(images)[0]), cpus(3),
        session_config=session_config, images=holder)
    with tf1.Session(config=session_config) as session:
      tf1.train.Saver().restore(session, path)
      got = session.run(parallel, {holder: images})
      got_two = session.run(parallel, {holder: images[:2]})
  np.testing.assert_allclose(got, want, atol=1e-6)
  np.testing.assert_allclose(got_two, want[:2], atol=1e-6)


def test_a_keras_model_built_beforehand_is_shared(session_config):
  model = tf.keras.Sequential([tf.keras.layers.Dense(
      2, kernel_initializer=tf1.constant_initializer(W0),
      bias_initializer=tf1.constant_initializer(B0))])
  x_value = np.random.RandomState(3).randn(3, 3).astype(np.float32)
  with tf.Graph().as_default():
    model.build((None, 3))
    out = emg.make_parallel(model, cpus(2), session_config=session_config,
                            inputs=tf.constant(x_value))
    assert len(tf1.global_variables()) == 2
    with tf1.Session(config=session_config) as session:
      session.run(tf1.global_variables_initializer())
      np.testing.assert_allclose(session.run(out), x_value @ W0 + B0,
                                 atol=1e-5)


def test_an_unbuilt_keras_model_from_outside_is_a_clear_error(
    session_config):
  model = tf.keras.Sequential([tf.keras.layers.Dense(2)])
  with tf.Graph().as_default(), pytest.raises(ValueError,
                                              match=r"model\.build"):
    emg.make_parallel(model, cpus(2), session_config=session_config,
                      inputs=tf.zeros([4, 3]))


def test_a_variable_only_later_towers_create_is_a_clear_error(
    session_config):
  calls = []

  def fn(x):
    calls.append(x)
    name = "w" if len(calls) == 1 else "other"
    return x * tf1.get_variable(name, [], initializer=tf1.ones_initializer())

  with tf.Graph().as_default(), pytest.raises(
      ValueError, match="tower 1 .* did not create the variables"):
    emg.make_parallel(fn, cpus(2), session_config=session_config,
                      x=tf.zeros([4]))


@pytest.mark.parametrize("devices,config,match", [
    (["/cpu:0", "/cpu:4"], True, "asks for /cpu:4, which this session will "
     "not have; it has /cpu:0, /cpu:1, /cpu:2, /cpu:3.*pass make_parallel"),
    (["/gpu:0"], False, "asks for /gpu:0, which this process does not see"),
    (["/tpu:0"], True, "is not a device"),
    (0, True, "asks for 0 GPUs"),
])
def test_devices_are_checked_to_exist(devices, config, match,
                                      session_config):
  with tf.Graph().as_default(), pytest.raises(ValueError, match=match):
    emg.make_parallel(tanh_layer, devices,
                      session_config=session_config if config else None,
                      x=tf.zeros([4, 3]))


def test_every_device_spelling_and_the_default_are_accepted(session_config):
  with tf.Graph().as_default():
    x = tf.zeros([4, 3])
    emg.make_parallel(tanh_layer, ["/CPU:0", "/device:CPU:1", "cpu:2"],
                      session_config=session_config, x=x)
    with tf1.variable_scope("default"):
      out = emg.make_parallel(tanh_layer, None, x=x)  # one CPU tower.
  assert out["y"].op.device == "/device:CPU:0"


def test_aggregation_device_is_checked_and_holds_the_variables(session_config):
  with tf.Graph().as_default() as graph:
    emg.make_parallel(tanh_layer, cpus(2), session_config=session_config,
                      aggregation_device="/cpu:3", x=tf.zeros([4, 3]))
    with pytest.raises(ValueError, match="asks for /cpu:7"):
      emg.make_parallel(tanh_layer, cpus(2), session_config=session_config,
                        aggregation_device="/cpu:7", x=tf.zeros([4, 3]))
  handles = [op for op in graph.get_operations() if op.type == "VarHandleOp"]
  assert {op.device for op in handles} == {"/device:CPU:3"}


@pytest.mark.parametrize("inputs,match", [
    ({}, "no batched inputs"),
    ({"x": np.float32(1.0)}, "`x` is a scalar"),
    ({"x": np.zeros([4, 3], np.float32), "y": {"a": np.zeros([5])}},
     r"`x` has 4, `y\['a'\]` has 5"),
])
def test_bad_inputs_are_clear_errors(inputs, match, session_config):
  with tf.Graph().as_default(), pytest.raises(ValueError, match=match):
    emg.make_parallel(lambda **kw: kw, cpus(2),
                      session_config=session_config, **inputs)


def test_batch_sizes_that_disagree_at_run_time_fail_the_run(session_config):
  with tf.Graph().as_default():
    x, y = (tf1.placeholder(tf.float32, [None]) for _ in range(2))
    out = emg.make_parallel(lambda x, y: x + y, cpus(2),
                            session_config=session_config, x=x, y=y)
    with tf1.Session(config=session_config) as session, pytest.raises(
        tf.errors.InvalidArgumentError, match="disagree on the batch size"):
      session.run(out, {x: np.zeros(4), y: np.zeros(3)})


@pytest.mark.parametrize("fn,error,match", [
    (lambda x: tf.reduce_sum(x), ValueError, "output `<output>` is a scalar"),
    (lambda x: {"s": tf.sparse.from_dense(x)}, TypeError,
     "output `s` is a SparseTensor"),
])
def test_outputs_that_cannot_be_joined_are_clear_errors(fn, error, match,
                                                        session_config):
  with tf.Graph().as_default(), pytest.raises(error, match=match):
    emg.make_parallel(fn, cpus(2), session_config=session_config,
                      x=tf.zeros([4, 3]))


def test_towers_returning_different_structures_is_a_clear_error(
    session_config):
  calls = []

  def fn(x):
    calls.append(x)
    return (x,) if len(calls) == 1 else (x, x)

  with tf.Graph().as_default(), pytest.raises(
      ValueError, match="Tower 1 of `make_parallel` returned a different"):
    emg.make_parallel(fn, cpus(2), session_config=session_config,
                      x=tf.zeros([4, 3]))


def test_training_inside_fn_points_to_multi_gpu(session_config):
  def fn(x):
    loss = tf.reduce_sum(x * tf1.get_variable("w", [3]))
    emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1)).minimize(loss)
    return x

  with tf.Graph().as_default(), pytest.raises(ValueError, match="multi_gpu"):
    emg.make_parallel(fn, cpus(2), session_config=session_config,
                      x=tf.zeros([4, 3]))


def test_device_groups_and_aggregation_device_go_through_the_plan(
    session_config):
  """make_parallel takes device groups like multi_gpu: one tower per group,
  its ops on the group's first device; variables on the aggregation
  device."""
  with tf.Graph().as_default() as graph:
    out = emg.make_parallel(tanh_layer, [["/cpu:1", "/cpu:2"], ["/cpu:3"]],
                            session_config=session_config,
                            aggregation_device="/cpu:0",
                            x=tf.ones([3, 3]))
  handles = [op for op in graph.get_operations() if op.type == "VarHandleOp"]
  assert {op.device for op in handles} == {"/device:CPU:0"}
  tanh_ops = sorted((op.name, op.device) for op in graph.get_operations()
                    if op.type == "Tanh")
  assert [device for _, device in tanh_ops] == ["/device:CPU:1",
                                                "/device:CPU:3"]
  assert out["y"].shape.as_list()[0] == 3
