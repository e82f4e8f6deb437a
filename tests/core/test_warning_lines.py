"""True, single warning lines (issue 54, row 1).

A batch-norm net without `sync_batch_norm`, whichever library builds its
layers (tf-slim, `tf.compat.v1.layers`, Keras), and however its UPDATE_OPS
run with the step (a control dependency of `minimize`, grouped into the
train_op), gets one WARNING on 2 towers: the local-statistics one. Tower
0's UPDATE_OPS are not writes of the model_fn's own (multi_gpu runs them
once per step), nor are a layer's moving averages outside them (tf-slim's
`updates_collections=None`, a Keras model's `updates`). A cause shared by many layers (moving averages written
outside UPDATE_OPS) is one line per model and mode, naming the variables.
"""

import logging

import pytest
import tensorflow as tf
from test_train_op_state import model_fn_with
import tf_slim as slim

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
X, Y = harness.linear_data(8)
LAYERS = 3  # batch-norm layers per net: rank 2 (the layer's own moments),
# then rank 4 (fused batch norm).


def image(h):
  return tf.reshape(h, [-1, 2, 2, 1]) if h.shape.rank == 2 else h


def units(h):
  return 4 if h.shape.rank == 2 else 1  # then [batch, 2, 2, 1] again.


def slim_net(h, training):
  for i in range(LAYERS):
    h = slim.batch_norm(slim.fully_connected(h, units(h), scope=f"fc{i}"),
                        is_training=training, scope=f"bn{i}")
    h = image(h)
  return tf.reshape(h, [-1, 4]), tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)


def slim_inline_net(h, training):
  """tf-slim's updates in the layer's output (updates_collections=None)."""
  for i in range(LAYERS):
    h = slim.batch_norm(slim.fully_connected(h, units(h), scope=f"fc{i}"),
                        is_training=training, scope=f"bn{i}",
                        updates_collections=None)
    h = image(h)
  return tf.reshape(h, [-1, 4]), []


def tf1_layers_net(h, training):
  for _ in range(LAYERS):
    h = image(tf1.layers.batch_normalization(tf1.layers.dense(h, units(h)),
                                             training=training))
  return tf.reshape(h, [-1, 4]), tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)


def keras_net(h, training):
  layers = [tf.keras.layers.Dense(4), tf.keras.layers.BatchNormalization(),
            tf.keras.layers.Reshape([2, 2, 1])]
  for _ in range(LAYERS - 1):
    layers += [tf.keras.layers.Dense(1), tf.keras.layers.BatchNormalization()]
  model = tf.keras.Sequential(layers + [tf.keras.layers.Flatten()])
  return model(h, training=training), model.updates


NETS = {"slim": slim_net, "slim_inline": slim_inline_net,
        "tf1_layers": tf1_layers_net, "keras": keras_net}


def model_fn_of(net, wiring):
  """A regression net whose train_op runs the net's moving-average updates
  as `wiring` says: a control dependency of minimize, or grouped."""

  def model_fn(features, labels, mode):
    h, updates = net(features, mode == tf.estimator.ModeKeys.TRAIN)
    loss = tf1.losses.mean_squared_error(labels, tf1.layers.dense(h, 2))
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
    step = tf1.train.get_global_step()
    if wiring == "control_dependency":
      with tf.control_dependencies(updates):
        train_op = opt.minimize(loss, step)
    else:
      train_op = tf.group(opt.minimize(loss, step), *updates)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  return model_fn


def warnings_of(caplog):
  return [r.getMessage() for r in caplog.records
          if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("wiring", ["control_dependency", "grouped"])
@pytest.mark.parametrize("net", sorted(NETS))
def test_a_batch_norm_net_gets_only_the_local_statistics_warning(
    net, wiring, caplog, session_config):
  with caplog.at_level(logging.WARNING, logger="absl"):
    harness.train(model_fn_of(NETS[net], wiring), X, Y, 1, session_config,
                  num_towers=2)
  warnings = warnings_of(caplog)
  assert len(warnings) == 1, warnings
  assert "batch norm in training normalizes each tower's shard" in (
      warnings[0])
  assert "2 towers" in warnings[0]


def hand_written_batch_norms(features, labels, w):
  """LAYERS moving means written outside UPDATE_OPS from the tower's own
  moments (what the warning is for)."""
  del labels, w
  updates = []
  for i in range(LAYERS):
    moving = tf1.get_variable(f"moving_mean_{i}", initializer=tf.zeros([3]),
                              trainable=False)
    mean, _ = tf.nn.moments(features * float(i + 1), [0])
    updates.append(tf1.assign_sub(moving, (moving - mean) * 0.1))
  return features, tf.group(*updates)


def linear_model_fn(features, labels, mode):
  w = tf1.get_variable("w", initializer=tf.ones([3, 2]) * 0.1)
  predictions = tf.matmul(features, w)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions=predictions)
  return tf.estimator.EstimatorSpec(
      mode, loss=tf1.losses.mean_squared_error(labels, predictions))


def test_writes_of_many_layers_are_one_devices(caplog, session_config):
  """By default each moving mean is written from the global batch's mean,
  once per step: one device's values, no warning."""
  want, _ = harness.train(model_fn_with(hand_written_batch_norms), X, Y, 1,
                          session_config)
  with caplog.at_level(logging.WARNING, logger="absl"):
    got, _ = harness.train(model_fn_with(hand_written_batch_norms), X, Y, 1,
                           session_config, num_towers=2)
  assert not [w for w in warnings_of(caplog) if "shard only" in w]
  harness.assert_same_variables(got, want)


def test_writes_of_many_layers_are_one_line_naming_them(caplog,
                                                        session_config):
  """With global_batch=False they are tower 0's: one line names them all."""
  with caplog.at_level(logging.WARNING, logger="absl"):
    harness.train(model_fn_with(hand_written_batch_norms), X, Y, 1,
                  session_config, num_towers=2, global_batch=False)
  warnings = [w for w in warnings_of(caplog) if "shard only" in w]
  assert len(warnings) == 1, warnings
  for i in range(LAYERS):
    assert f"`moving_mean_{i}`" in warnings[0]
  assert "3 variables" in warnings[0] and "cross_tower_moments" in warnings[0]


@pytest.mark.parametrize("mode", ["eval", "infer"])
def test_the_plan_line_of_eval_and_predict_names_no_gradients(
    mode, caplog, session_config):
  with caplog.at_level(logging.INFO, logger="absl"), tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    harness.call(emg.multi_gpu(linear_model_fn, devices=["/cpu:0", "/cpu:1"]),
                 tf.constant(X), tf.constant(Y), mode, session_config)
  lines = [r.getMessage() for r in caplog.records
           if r.getMessage().startswith("multi_gpu ")]
  assert lines == [f"multi_gpu {mode}: 2 towers on /cpu:0, /cpu:1; variables "
                   "on /cpu:0; global batch 8 -> per-tower batch [4, 4]"]


@pytest.mark.parametrize("image_shaped", [False, True], ids=["moments",
                                                            "fused"])
def test_a_write_of_a_batch_norm_output_adds_no_warning(image_shaped, caplog,
                                                       session_config):
  """A moving mean of what a batch-norm layer outputs (not of its
  statistics) is written from the global batch's mean of those outputs:
  the layer's own warning (local statistics) is the only one."""

  def model_fn(features, labels, mode):
    h = tf1.layers.dense(features, 4)
    layer = tf.keras.layers.BatchNormalization(name="bn")
    h = layer(image(h) if image_shaped else h, training=True)
    h = tf.reshape(h, [-1, 4])
    centers = tf1.get_variable("centers", initializer=tf.zeros([4]),
                               trainable=False)
    update = tf1.assign_sub(centers, (centers - tf.reduce_mean(h, 0)) * 0.1)
    loss = tf1.losses.mean_squared_error(labels, tf1.layers.dense(h, 2))
    opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
    train_op = tf.group(opt.minimize(loss, tf1.train.get_global_step()),
                        update, *layer.updates)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  with caplog.at_level(logging.WARNING, logger="absl"):
    harness.train(model_fn, X, Y, 1, session_config, num_towers=2)
  warnings = warnings_of(caplog)
  assert len(warnings) == 1, warnings
  assert "batch norm in training" in warnings[0]


def test_an_unwrapped_optimizer_is_the_error_alone(caplog, session_config):
  """Its apply is not warned about as the model_fn's writes first."""

  def model_fn(features, labels, mode):
    loss = tf1.losses.mean_squared_error(labels,
                                         tf1.layers.dense(features, 2))
    opt = tf1.train.GradientDescentOptimizer(0.1)
    return tf.estimator.EstimatorSpec(
        mode, loss=loss,
        train_op=opt.minimize(loss, tf1.train.get_global_step()))

  with caplog.at_level(logging.WARNING, logger="absl"), pytest.raises(
      ValueError, match="does not come from a `TowerOptimizer`"):
    harness.train(model_fn, X, Y, 1, session_config, num_towers=2)
  assert warnings_of(caplog) == []
