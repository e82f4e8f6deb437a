"""variable_update="replicated": a copy per tower, all-reduced gradients.

The exactness tests of `test_training_exact.py` run in every mode; here are
the replicated mode's own promises. The model is linear regression with an
embedding term, pred = x @ W + b + Σⱼ E[idsⱼ], loss = mean((pred - y)²) over
the batch and the 2 outputs. With r = pred - y and s = 2 / r.size:
dW = s·xᵀr, db = s·Σ r, and row k of dE is s·Σ r[i] over the (i, j) with
ids[i, j] = k, a sparse (`IndexedSlices`) gradient.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu.strategies import all_reduce as all_reduce_lib

import harness

tf1 = tf.compat.v1
W0 = np.array([[0.1, -0.2], [0.3, 0.05], [-0.4, 0.2]], np.float32)
B0 = np.array([0.01, -0.02], np.float32)
E0 = np.arange(10, dtype=np.float32).reshape(5, 2) / 10.0
LR = 0.05
REPLICATED = [m for m in harness.VARIABLE_MODES if m.startswith("replicated")]
RNG = np.random.RandomState(3)
X, Y = harness.linear_data(7)
IDS = RNG.randint(0, 5, size=(7, 2)).astype(np.int64)


def embedding_model_fn(optimizer):
  def model_fn(features, labels, mode):
    w = tf1.get_variable("w", initializer=W0)
    b = tf1.get_variable("b", initializer=B0)
    emb = tf1.get_variable("emb", initializer=E0)
    pred = (tf.matmul(features["x"], w) + b +
            tf.reduce_sum(tf.gather(emb, features["ids"]), axis=1))
    loss = tf.reduce_mean(tf.square(pred - labels))
    opt = emg.TowerOptimizer(optimizer())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
        loss, tf1.train.get_global_step()))
  return model_fn


def numpy_sgd(steps):
  w, b, e = (W0.astype(np.float64), B0.astype(np.float64),
             E0.astype(np.float64))
  for _ in range(steps):
    r = X @ w + b + e[IDS].sum(axis=1) - Y
    s = 2.0 / r.size
    grad_e = np.zeros_like(e)
    for j in range(IDS.shape[1]):
      np.add.at(grad_e, IDS[:, j], s * r)
    w, b, e = w - LR * s * X.T @ r, b - LR * s * r.sum(axis=0), e - LR * grad_e
  return w, b, e


FEATURES = {"x": X, "ids": IDS}


@pytest.mark.parametrize("mode", REPLICATED)
def test_sparse_gradients_match_numpy(mode, session_config):
  values, _ = harness.train(
      embedding_model_fn(lambda: tf1.train.GradientDescentOptimizer(LR)),
      FEATURES, Y, 3, session_config, num_towers=3,
      **harness.VARIABLE_MODES[mode])
  for name, want in zip(["w", "b", "emb"], numpy_sgd(3)):
    np.testing.assert_allclose(values[name], want, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("mode", REPLICATED)
def test_copies_stay_bit_identical_and_match_shared(mode, session_config):
  # 20 Adam steps, batch 7 over 3 towers (3, 2, 2 rows), sparse and dense.
  model_fn = embedding_model_fn(lambda: tf1.train.AdamOptimizer(LR))
  values, _ = harness.train(model_fn, FEATURES, Y, 20, session_config,
                            num_towers=3, local_variables=True,
                            **harness.VARIABLE_MODES[mode])
  shared, _ = harness.train(model_fn, FEATURES, Y, 20, session_config,
                            num_towers=3)
  replicated = sorted(name for name in shared if name != "global_step")
  assert len(replicated) == 11  # w, b, emb, 2 Adam slots each, 2 powers.
  assert sorted(values) == sorted(
      list(shared) + [f"tower_{i}/{name}" for i in (1, 2)
                      for name in replicated])
  for name in replicated:
    for tower in (1, 2):
      np.testing.assert_array_equal(values[f"tower_{tower}/{name}"],
                                    values[name], err_msg=name)
    np.testing.assert_allclose(values[name], shared[name], rtol=1e-6,
                               atol=1e-7, err_msg=name)
  assert values["global_step"] == 20


@pytest.mark.parametrize("algorithm", all_reduce_lib.ALGORITHMS)
@pytest.mark.parametrize("packing_bytes", [0, 40])
def test_all_reduce_gives_every_tower_the_sum(algorithm, packing_bytes,
                                              session_config):
  devices = harness.cpu_devices(3)
  dense = [RNG.randn(3, 2).astype(np.float32) for _ in devices]
  vector = [RNG.randn(5).astype(np.float32) for _ in devices]
  with tf.Graph().as_default():
    variables = [tf1.Variable(np.zeros(shape, np.float32))
                 for shape in [(3, 2), (5,), (6, 2), (2,)]]
    grads = []
    for tower, device in enumerate(devices):
      with tf.device(device):
        rows = tower + 1  # towers 0, 1 send 1 and 2 rows; tower 2 none.
        sparse = tf.IndexedSlices(
            tf.constant(np.full((rows, 2), rows, np.float32)),
            tf.constant(np.arange(rows, dtype=np.int64)), tf.constant([6, 2]))
        grads.append([tf.constant(dense[tower]),
                      None if tower == 1 else tf.constant(vector[tower]),
                      None if tower == 2 else sparse, None])
    summed, _ = all_reduce_lib.all_reduce(grads, variables, devices, algorithm,
                                     packing_bytes, devices[0])
    assert all(isinstance(s[2], tf.IndexedSlices) and s[3] is None
               for s in summed)
    with tf1.Session(config=session_config) as session:
      got = session.run([[s[0], s[1], tf.convert_to_tensor(s[2])]
                         for s in summed])
  # Row 0 gets 1 (tower 0) + 2 (tower 1), row 1 gets 2 (tower 1).
  want_sparse = np.zeros((6, 2), np.float32)
  want_sparse[0], want_sparse[1] = 3.0, 2.0
  for tower_dense, tower_vector, tower_sparse in got:
    np.testing.assert_allclose(tower_dense, sum(dense), rtol=1e-6)
    np.testing.assert_allclose(tower_vector, vector[0] + vector[2], rtol=1e-6)
    np.testing.assert_array_equal(tower_sparse, want_sparse)
  for tower in got[1:]:  # bit-identical in every tower.
    for a, b in zip(tower, got[0]):
      np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("algorithm", all_reduce_lib.ALGORITHMS)
@pytest.mark.parametrize("packing_bytes", [0, 40, 1 << 20])
def test_a_carried_scalar_is_summed_with_the_gradients(algorithm,
                                                      packing_bytes,
                                                      session_config):
  """The loss rides in the first float32 buffer: its sum comes back, and
  every gradient is still the numpy sum, shape included (packing 0: a
  buffer of one (3, 2) gradient, flattened to carry and reshaped back)."""
  devices = harness.cpu_devices(3)
  dense = [RNG.randn(3, 2).astype(np.float32) for _ in devices]
  vector = [RNG.randn(5).astype(np.float32) for _ in devices]
  losses = [np.float32(v) for v in (0.5, 1.25, -2.0)]
  with tf.Graph().as_default():
    variables = [tf1.Variable(np.zeros(shape, np.float32))
                 for shape in [(3, 2), (5,)]]
    grads, carry = [], []
    for tower, device in enumerate(devices):
      with tf.device(device):
        grads.append([tf.constant(dense[tower]), tf.constant(vector[tower])])
        carry.append(tf.constant(losses[tower]))
    summed, carried = all_reduce_lib.all_reduce(
        grads, variables, devices, algorithm, packing_bytes, devices[0],
        carry=carry)
    assert [s.shape.as_list() for s in summed[1]] == [[3, 2], [5]]
    with tf1.Session(config=session_config) as session:
      got, total = session.run([summed, carried])
  assert total == pytest.approx(0.5 + 1.25 - 2.0, abs=1e-6)
  for tower_dense, tower_vector in got:
    np.testing.assert_allclose(tower_dense, np.sum(dense, 0), rtol=1e-6)
    np.testing.assert_allclose(tower_vector, np.sum(vector, 0), rtol=1e-6)


def test_keras_layers_and_tf_gradients_use_the_towers_copies(session_config):
  # Inside tower i, trainable_variables() lists that tower's copies, so the
  # plain tf.gradients + apply_gradients path works too. The loss is a sum
  # over the tower's examples divided by the global size (7 rows · 2
  # outputs), so with loss_reduction="sum" the towers' losses add up to the
  # global mean and no per-tower weight is needed.
  def keras_model_fn(features, labels, mode):
    layer = tf.keras.layers.Dense(
        2, kernel_initializer=tf1.constant_initializer(W0),
        bias_initializer=tf1.constant_initializer(B0), name="lin")
    loss = tf.reduce_sum(tf.square(layer(features) - labels)) / 14.0
    variables = tf1.trainable_variables()
    grads = tf.gradients(loss, variables)
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(LR))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=(
        opt.apply_gradients(zip(grads, variables),
                            tf1.train.get_global_step())))

  values, _ = harness.train(keras_model_fn, X, Y, 3, session_config,
                            num_towers=3, local_variables=True,
                            variable_update="replicated",
                            loss_reduction="sum")
  w, b = W0.astype(np.float64), B0.astype(np.float64)
  for _ in range(3):
    r = X @ w + b - Y
    w, b = w - LR * 2 / r.size * X.T @ r, b - LR * 2 / r.size * r.sum(0)
  np.testing.assert_allclose(values["lin/kernel"], w, atol=1e-5)
  np.testing.assert_allclose(values["lin/bias"], b, atol=1e-5)
  np.testing.assert_array_equal(values["tower_2/lin/kernel"],
                                values["lin/kernel"])


def test_copies_are_local_and_on_their_towers(session_config):
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    fn = emg.multi_gpu(embedding_model_fn(
        lambda: tf1.train.MomentumOptimizer(LR, 0.9)),
                       devices=["/cpu:1", "/cpu:2"],
                       variable_update="replicated")
    harness.call(fn, {"x": tf.constant(X), "ids": tf.constant(IDS)},
                 tf.constant(Y), "train", session_config)
    devices = {v.op.name: v.device for v in
               tf1.global_variables() + tf1.local_variables()}
    assert sorted(v.op.name for v in tf1.trainable_variables()) == [
        "b", "emb", "w"]
    assert sorted(v.op.name for v in tf1.local_variables()) == [
        "tower_1/b", "tower_1/b/Momentum", "tower_1/emb",
        "tower_1/emb/Momentum", "tower_1/w", "tower_1/w/Momentum"]
  assert devices["w"] == devices["w/Momentum"] == "/device:CPU:1"
  assert devices["tower_1/w"] == devices["tower_1/w/Momentum"] == (
      "/device:CPU:2")


def momentum_model_fn(features, labels, mode):
  w = tf1.get_variable("w", initializer=W0)
  loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
  opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(LR, 0.9))
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
      loss, tf1.train.get_global_step()))


def numpy_momentum(steps):
  w, m = W0.astype(np.float64), np.zeros(W0.shape)
  for _ in range(steps):
    r = X @ w - Y
    m = 0.9 * m + 2.0 / r.size * X.T @ r
    w = w - LR * m
  return w


def input_fn():
  return tf.data.Dataset.from_tensors((X, Y)).repeat()


def estimator(model_dir, session_config, num_towers=None, **options):
  model_fn = momentum_model_fn if num_towers is None else emg.multi_gpu(
      momentum_model_fn, devices=harness.cpu_devices(num_towers), **options)
  return tf.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(
      str(model_dir), session_config=session_config))


@pytest.mark.parametrize("first,second", [
    ((3, "replicated"), (2, "shared")), ((2, "shared"), (3, "replicated"))])
def test_checkpoints_move_between_modes_and_tower_counts(
    first, second, session_config, tmp_path):
  # Momentum carries state across the restore: if tower 1..'s copies or
  # slots were not reset from the checkpoint, step 3 would differ.
  run = tmp_path / "run"
  estimator(run, session_config, first[0],
            variable_update=first[1]).train(input_fn, max_steps=2)
  reference = estimator(tmp_path / "reference", session_config)
  reference.train(input_fn, max_steps=2)
  assert (tf.train.list_variables(str(run)) ==
          tf.train.list_variables(reference.model_dir))
  loss = estimator(run, session_config).evaluate(input_fn, steps=1)["loss"]
  np.testing.assert_allclose(loss, np.mean((X @ numpy_momentum(2) - Y) ** 2),
                             rtol=1e-5)
  resumed = estimator(run, session_config, second[0],
                      variable_update=second[1])
  resumed.train(input_fn, max_steps=4)
  np.testing.assert_allclose(resumed.get_variable_value("w"),
                             numpy_momentum(4), atol=1e-5)
  assert resumed.get_variable_value("global_step") == 4


def test_export_holds_no_copies_and_no_devices(session_config, tmp_path):
  trained = estimator(tmp_path / "run", session_config, 3,
                      variable_update="replicated")
  trained.train(input_fn, max_steps=2)

  def serving_input_fn():
    x = tf1.placeholder(tf.float32, [None, 3], name="x")
    return tf.estimator.export.ServingInputReceiver({"x": x}, {"x": x})

  def predict_model_fn(features, labels, mode):
    if mode != tf.estimator.ModeKeys.PREDICT:
      return momentum_model_fn(features, labels, mode)
    w = tf1.get_variable("w", initializer=W0)
    return tf.estimator.EstimatorSpec(
        mode, predictions=tf.matmul(features["x"], w))

  exporter = tf.estimator.Estimator(
      emg.multi_gpu(predict_model_fn, devices=harness.cpu_devices(3),
                    variable_update="replicated"),
      config=tf.estimator.RunConfig(str(tmp_path / "run"),
                                    session_config=session_config))
  export_dir = exporter.export_saved_model(str(tmp_path / "export"),
                                           serving_input_fn)
  with tf.Graph().as_default(), tf1.Session(config=tf1.ConfigProto(
      device_count={"CPU": 1})) as session:
    meta = tf1.saved_model.loader.load(session, ["serve"], export_dir)
    nodes = meta.graph_def.node
    assert not [n.name for n in nodes if "tower_" in n.name]
    assert {n.device for n in nodes if not n.name.startswith("save")} == {""}
    signature = meta.signature_def["serving_default"]
    got = session.run(signature.outputs["output"].name,
                      {signature.inputs["x"].name: X[:4]})
  np.testing.assert_allclose(got, X[:4] @ numpy_momentum(2), atol=1e-5)


def test_sync_replicas_optimizer_is_an_error(session_config):
  def sync_model_fn(features, labels, mode):
    w = tf1.get_variable("w", initializer=W0)
    loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
    opt = emg.TowerOptimizer(tf1.train.SyncReplicasOptimizer(
        tf1.train.GradientDescentOptimizer(LR), replicas_to_aggregate=1))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
        loss, tf1.train.get_global_step()))

  with tf.Graph().as_default(), pytest.raises(
      ValueError, match="`SyncReplicasOptimizer` was given with"):
    tf1.train.get_or_create_global_step()
    harness.call(emg.multi_gpu(sync_model_fn, devices=["/cpu:0", "/cpu:1"],
                               variable_update="replicated"),
                 tf.constant(X), tf.constant(Y), "train", session_config)


def test_parameter_server_cluster_is_an_error(session_config):
  class PsConfig:  # what Estimator's RunConfig reports in a ps cluster.
    num_ps_replicas = 2

  PsConfig.session_config = session_config

  fn = emg.multi_gpu(momentum_model_fn, devices=["/cpu:0", "/cpu:1"],
                     variable_update="replicated")
  with tf.Graph().as_default(), pytest.raises(
      ValueError, match="in a cluster with 2 parameter server task"):
    tf1.train.get_or_create_global_step()
    fn(tf.constant(X), tf.constant(Y), "train", {}, PsConfig())


def test_plan_log_names_the_replicated_mode(session_config, caplog):
  with caplog.at_level(logging.INFO, logger="absl"):
    harness.train(momentum_model_fn, X[:5], Y[:5], 1, session_config,
                  num_towers=3, variable_update="replicated",
                  all_reduce="add_n")
  assert [r.getMessage() for r in caplog.records
          if "multi_gpu train" in r.getMessage()] == [
              "multi_gpu train: 3 towers on /cpu:0, /cpu:1, /cpu:2; "
              "variables a copy per tower; gradients all-reduced by add_n in "
              "buffers of 64 MiB; global batch 5 -> per-tower batch [2, 2, 1]"]


@pytest.mark.parametrize("kind", ["get_variable", "layers", "keras",
                                  "trainable_variables"])
def test_weight_decay_applies_to_each_towers_copies(kind, session_config):
  # Tower i's REGULARIZATION_LOSSES and trainable_variables() are its own
  # copies', so weight decay reaches every tower's gradient; the run must
  # equal the unwrapped model_fn's (loss and weights), like the shared mode.
  def model_fn(features, labels, mode):
    decay = lambda w: 0.1 * tf.reduce_sum(tf.square(w))
    init = tf1.constant_initializer(0.3)
    if kind == "get_variable":
      pred = tf.matmul(features, tf1.get_variable(
          "w", [3, 2], initializer=init, regularizer=decay))
    elif kind == "layers":
      pred = tf1.layers.dense(features, 2, kernel_initializer=init,
                              kernel_regularizer=decay)
    elif kind == "keras":
      pred = tf.keras.layers.Dense(2, kernel_initializer=init,
                                   kernel_regularizer=decay)(features)
    else:
      pred = tf.matmul(features, tf1.get_variable("w", [3, 2],
                                                  initializer=init))
    loss = tf.reduce_mean(tf.square(pred - labels))
    if kind == "trainable_variables":
      loss += tf.add_n([decay(v) for v in tf1.trainable_variables()])
    else:
      loss += tf1.losses.get_regularization_loss()
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
        loss, tf1.train.get_global_step()))

  want, want_loss = harness.train(model_fn, X, Y, 3, session_config)
  got, loss = harness.train(model_fn, X, Y, 3, session_config, num_towers=3,
                            variable_update="replicated")
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  assert sorted(got) == sorted(want)
  for name, value in want.items():
    np.testing.assert_allclose(got[name], value, atol=1e-6, err_msg=name)
