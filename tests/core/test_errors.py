"""Mistakes get errors that say what was given, what was expected, the fix."""


import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
X, Y = harness.linear_data(6, out_dim=1)


def model_fn(features, labels, mode):
  w = tf1.get_variable("w", [3, 1])
  loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
      loss, tf1.train.get_global_step()))


def build(fn, session_config, features=X, labels=Y, num_towers=2):
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    wrapped = emg.multi_gpu(fn, devices=harness.cpu_devices(num_towers))
    return harness.call(wrapped, tf.constant(features), tf.constant(labels),
                        "train", session_config)


def test_features_and_labels_of_different_batch_sizes(session_config):
  with pytest.raises(ValueError, match=r"Inputs disagree on the batch size: "
                     r"`features` has 6 examples but `labels` has 4"):
    build(model_fn, session_config, labels=Y[:4])


def test_batch_sizes_that_differ_only_at_run_time(session_config):
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    x = tf1.placeholder(tf.float32, [None, 3])
    y = tf1.placeholder(tf.float32, [None, 1])
    spec = harness.call(emg.multi_gpu(model_fn, devices=["/cpu:0", "/cpu:1"]),
                        x, y, "train", session_config)
    with tf1.Session(config=session_config) as session:
      session.run(tf1.global_variables_initializer())
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match="Inputs disagree on the batch size: `labels` "
                         "and `features`"):
        session.run(spec.train_op, {x: X, y: Y[:4]})


def test_scalar_features_have_no_batch_dimension(session_config):
  with pytest.raises(ValueError, match="`features` is a scalar"):
    build(model_fn, session_config, features=np.float32(1.0))


@pytest.mark.parametrize("devices,message", [
    ([], "`devices` is an empty list"),
    (0, "asks for 0 GPUs"),
    ("gpu:0", "`devices` must be None, an int or a list"),
    (["gpu0"], "'gpu0' is not a device"),
    (["/tpu:0"], "'/tpu:0' is not a device"),
    (["/cpu:0", "/CPU:0"], "lists /cpu:0 more than once"),
    ([0], "entries must be strings"),
])
def test_bad_device_requests_fail_when_wrapping(devices, message):
  with pytest.raises((TypeError, ValueError), match=message):
    emg.multi_gpu(model_fn, devices=devices)


@pytest.mark.parametrize("devices,missing", [
    (["/cpu:0", "/cpu:7"], "/cpu:7"), (["/gpu:0", "/gpu:1"], "/gpu:0, /gpu:1"),
    (2, "/gpu:0, /gpu:1")])
def test_devices_the_session_lacks_are_listed(devices, missing,
                                              session_config):
  wrapped = emg.multi_gpu(model_fn, devices=devices)
  with tf.Graph().as_default():
    with pytest.raises(ValueError) as error:
      harness.call(wrapped, tf.constant(X), tf.constant(Y), "train",
                   session_config)
  assert f"asks for {missing}, which this session will not have" in str(
      error.value)
  assert "it has /cpu:0, /cpu:1, /cpu:2, /cpu:3." in str(error.value)


@pytest.mark.parametrize("options,message", [
    ({"loss_reduction": "avg"}, "`loss_reduction` is 'avg'; expected one of"),
    ({"ema_decay": 1.5}, r"`ema_decay` is 1.5; expected a number in \(0.0"),
    ({"ema_decay": 0.0}, r"`ema_decay` is 0.0; expected"),
    ({"ema_decay": "0.9"}, "`ema_decay` must be a number"),
    ({"clip_gradients_by_norm": -1.0}, "`clip_gradients_by_norm` is -1.0"),
    ({"aggregation_device": "/tpu:0"},
     "`aggregation_device` '/tpu:0' is not a device"),
    ({"aggregation_device": "cpu0"}, "`aggregation_device` 'cpu0' is not"),
    ({"aggregation_device": 3}, "`aggregation_device` must be a string like"),
    ({"use_ema_weights": "no"}, "`use_ema_weights` must be True or False; "
     "got 'no'"),
    ({"use_ema_weights": None}, "`use_ema_weights` must be True or False"),
    ({"variable_update": "mirrored"},
     "`variable_update` is 'mirrored'; expected one of 'auto', 'shared', "
     "'replicated'"),
    ({"variable_update": "shared", "all_reduce": "add_n"},
     "only applies to replicated variables"),
    ({"variable_update": "shared", "gradient_packing_bytes": 1024},
     "only applies to replicated"),
    ({"synchronization": "async", "all_reduce": "add_n"},
     "only applies to replicated variables"),
    ({"variable_update": "replicated", "all_reduce": "nccl"},
     "`all_reduce` is 'nccl'; expected one of 'collective', 'add_n', "
     "'hierarchical'"),
    ({"variable_update": "replicated", "gradient_packing_bytes": -1},
     "`gradient_packing_bytes` is -1; expected 0"),
    ({"variable_update": "replicated", "gradient_packing_bytes": 1.5},
     "`gradient_packing_bytes` must be an int"),
])
def test_bad_option_values(options, message):
  with pytest.raises((TypeError, ValueError), match=message):
    emg.multi_gpu(model_fn, **options)


def test_unwrapped_optimizer_with_several_towers(session_config):
  def raw_optimizer_model_fn(features, labels, mode):
    w = tf1.get_variable("w", [3, 1])
    loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
    train_op = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  with pytest.raises(ValueError, match=r"does not come from a `TowerOptimizer`"
                     r".*opt = estimator_multigpu.TowerOptimizer\(opt\)"):
    build(raw_optimizer_model_fn, session_config)


@pytest.mark.parametrize("returned", [None, {"loss": 1.0}])
def test_model_fn_that_returns_no_estimator_spec(returned, session_config):
  with pytest.raises(TypeError, match=r"The model_fn returned .*expected a "
                     r"tf.estimator.EstimatorSpec"):
    build(lambda features, labels, mode: returned, session_config)


def test_model_fn_without_loss_in_train(session_config):
  def no_loss(features, labels, mode):
    return tf.estimator.EstimatorSpec(mode, train_op=tf.no_op())

  with pytest.raises(ValueError, match="Missing loss"):
    build(no_loss, session_config)


def test_graph_mode_optimizer_is_required():
  with pytest.raises(TypeError, match="non-legacy Keras optimizer.*Use "
                     r"tf\.keras\.optimizers\.legacy\.SGD\(\.\.\.\)"):
    emg.TowerOptimizer(tf.keras.optimizers.SGD())


def in_tower_1():
  return tf1.get_default_graph().get_name_scope().startswith("tower_1")


def test_variable_created_in_one_tower_only(session_config):
  def extra_variable(features, labels, mode):
    if in_tower_1():
      tf1.get_variable("extra", [1])
    return model_fn(features, labels, mode)

  with pytest.raises(ValueError, match="Tower 1 asked `get_variable` for a "
                     "variable that tower 0 did not create"):
    build(extra_variable, session_config)


def test_keras_variable_created_in_one_tower_only(session_config):
  def extra_layer(features, labels, mode):
    if in_tower_1():
      features = tf.keras.layers.Dense(3)(features)
    return model_fn(features, labels, mode)

  with pytest.raises(ValueError, match="Tower 1 creates variable `kernel`, "
                     "which tower 0 did not create"):
    build(extra_layer, session_config)


def test_towers_that_call_the_optimizer_differently(session_config):
  def twice_in_tower_1(features, labels, mode):
    spec = model_fn(features, labels, mode)
    if in_tower_1():
      emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1)).minimize(
          spec.loss)
    return spec

  with pytest.raises(ValueError, match=r"different numbers of times: \[1, 2\]"):
    build(twice_in_tower_1, session_config)


def test_scalar_labels_have_no_batch_dimension(session_config):
  with pytest.raises(ValueError, match="`labels` is a scalar, but every "
                     "input to `multi_gpu` must have a batch dimension"):
    build(model_fn, session_config, labels=np.float32(1.0))


def test_non_scalar_loss(session_config):
  def vector_loss(features, labels, mode):
    spec = model_fn(features, labels, mode)
    return spec._replace(loss=tf.square(labels[:, 0]))

  with pytest.raises(ValueError, match="Loss must be scalar"):
    build(vector_loss, session_config)


def test_dict_features_whose_keys_change_between_batches(tmp_path,
                                                         session_config):
  def batches():
    labels = np.ones((4, 1), np.float32)
    yield {"x": X[:4], "extra": labels}, labels
    yield {"x": X[:4], "renamed": labels}, labels

  def input_fn():
    spec = tf.TensorSpec([None, 1])
    return tf.data.Dataset.from_generator(batches, output_signature=(
        {"x": tf.TensorSpec([None, 3]), "extra": spec}, spec))

  def dict_model_fn(features, labels, mode):
    return model_fn(features["x"] + features["extra"], labels, mode)

  estimator = tf.estimator.Estimator(
      emg.multi_gpu(dict_model_fn, devices=["/cpu:0", "/cpu:1"]),
      config=tf.estimator.RunConfig(str(tmp_path),
                                    session_config=session_config))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="did not match the expected structure"):
    estimator.train(input_fn, max_steps=3)



def test_a_nan_loss_names_the_non_finite_inputs(tmp_path, session_config):
  """NaN in 2 of the 18 feature values: the step fails with the counts and
  the fix (not Estimator's bare "NaN loss during training."), and no
  checkpoint is written after the step that saw it."""
  bad = X.copy()
  bad[1, 0] = np.nan
  bad[4, 2] = np.inf
  batches = [X, bad]  # step 0 finite, step 1 not.

  def input_fn():
    return tf.data.Dataset.from_tensor_slices(
        (np.stack(batches), np.stack([Y, Y]))).map(
            lambda x, y: ({"x": x}, y))

  estimator = tf.estimator.Estimator(
      emg.multi_gpu(lambda features, labels, mode: model_fn(
          features["x"], labels, mode), devices=["/cpu:0", "/cpu:1"]),
      config=tf.estimator.RunConfig(str(tmp_path), save_checkpoints_steps=1,
                                    session_config=session_config))
  with pytest.raises(tf.errors.InvalidArgumentError) as raised:
    estimator.train(input_fn, max_steps=5)
  message = raised.value.message
  assert ("the loss over the global batch is NaN. "
          "Non-finite (NaN or Inf) values in that global batch: "
          "features/x 2 of 18, labels 0 of 6.") in message
  assert "lower the learning rate" in message
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-1")
