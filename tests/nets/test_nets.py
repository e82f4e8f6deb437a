"""Tests for estimator_multigpu.nets: the factory, the zoo and the slim shim."""

import types

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import tensor as tensor_lib
import tf_slim as slim
from tf_slim.layers import layers as slim_layers

from estimator_multigpu import compat
from estimator_multigpu import slim_compat

import nets
from nets import cifarnet
from nets import lenet
from nets import mlp

tf1 = tf.compat.v1

pytestmark = pytest.mark.filterwarnings(
    "ignore:`layer.apply` is deprecated:UserWarning",
    "ignore:`tf.layers.flatten` is deprecated:UserWarning")

NUM_CLASSES = 5
BATCH = 2

# Reduced input sizes, where the architecture allows them; others use
# network_fn.default_image_size (AlexNet, VGG, OverFeat and Inception V1 end in
# fixed-size VALID layers).
SMALL_IMAGE_SIZES = {
    "inception_v2": 32,
    "inception_v3": 107,  # Smallest size for which the aux-logits head builds.
    "resnet_v1_50": 64, "resnet_v1_101": 64, "resnet_v1_152": 64,
    "resnet_v2_50": 64, "resnet_v2_101": 64, "resnet_v2_152": 64,
}
# Every net is built; only these also run a forward pass (time budget).
FORWARD_NETS = {"alexnet_v2", "cifarnet", "inception_v2", "lenet", "mlp",
                "resnet_v1_50", "resnet_v2_50", "vgg_a"}
BATCH_NORM_NETS = {name for name in nets.NETWORK_NAMES
                   if name.startswith(("inception", "resnet"))}


@pytest.fixture
def fast_graph_building():
  """Builds graphs with TF1 tensor hashing, for speed only.

  Legacy layers hash every global variable each time they add a weight, and
  with TF2 tensor equality each hash costs a call to
  ``executing_eagerly_outside_functions``: graph building becomes quadratic
  (ResNet-152 takes ~26 s instead of ~7 s). The graphs are identical.
  """
  was_enabled = getattr(tf.Tensor, "_USE_EQUALITY", True)
  tf1.disable_tensor_equality()
  try:
    yield
  finally:
    if was_enabled:
      tf1.enable_tensor_equality()


@pytest.fixture
def stock_slim_batch_norm():
  """Temporarily removes the shim, restoring it afterwards."""
  slim_compat.unpatch_slim_batch_norm()
  try:
    yield
  finally:
    slim_compat.patch_slim_batch_norm()


def _images(size, channels=3, batch=BATCH):
  """Returns a float32 placeholder for a batch of square images."""
  return tf1.placeholder(tf.float32, [batch, size, size, channels])


def _random_feed(images, seed=0):
  """Returns a feed dict filling ``images`` with uniform noise."""
  shape = images.shape.as_list()
  return {images: np.random.default_rng(seed).random(shape, np.float32)}


def _run(fetches, feed):
  """Initializes the default graph's variables and runs ``fetches``."""
  with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    return sess.run(fetches, feed)


# --- Factory ---------------------------------------------------------------

def test_network_names_are_sorted_and_complete():
  expected = {"alexnet_v2", "cifarnet", "inception_v1", "inception_v2",
              "inception_v3", "lenet", "mlp", "overfeat", "resnet_v1_50",
              "resnet_v1_101", "resnet_v1_152", "resnet_v2_50",
              "resnet_v2_101", "resnet_v2_152", "vgg_a", "vgg_16", "vgg_19"}
  assert nets.NETWORK_NAMES == sorted(expected)
  assert sorted(nets.__all__) == ["NETWORK_NAMES", "get_network_fn"]


def test_unknown_network_error_names_it_and_lists_valid_ones():
  with pytest.raises(ValueError) as error:
    nets.get_network_fn("foo", NUM_CLASSES)
  assert str(error.value) == (
      "Unknown network `foo`; expected one of: alexnet_v2, cifarnet, "
      "inception_v1, inception_v2, inception_v3, lenet, mlp, overfeat, "
      "resnet_v1_101, resnet_v1_152, resnet_v1_50, resnet_v2_101, "
      "resnet_v2_152, resnet_v2_50, vgg_16, vgg_19, vgg_a.")


@pytest.mark.parametrize("name, size", [
    ("lenet", 28), ("cifarnet", 32), ("mlp", 8), ("alexnet_v2", 224),
    ("inception_v3", 299), ("overfeat", 231), ("resnet_v2_50", 224),
    ("vgg_16", 224)])
def test_default_image_size(name, size):
  assert nets.get_network_fn(name, NUM_CLASSES).default_image_size == size


@pytest.mark.usefixtures("fast_graph_building")
@pytest.mark.parametrize("name", nets.NETWORK_NAMES)
def test_every_network_builds_and_predicts(name):
  network_fn = nets.get_network_fn(name, NUM_CLASSES)
  size = SMALL_IMAGE_SIZES.get(name, network_fn.default_image_size)
  with tf.Graph().as_default():
    images = _images(size)
    logits, end_points = network_fn(images)
    assert logits.shape.as_list() == [BATCH, NUM_CLASSES]
    assert end_points["Logits"] is logits
    names = [v.op.name for v in tf1.global_variables()]
    assert names and len(names) == len(set(names))
    # is_training=False: batch norm runs in inference mode.
    assert not tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
    if name in BATCH_NORM_NETS:
      assert any(n.endswith("/BatchNorm/moving_mean") for n in names)
    if name in FORWARD_NETS:
      assert np.isfinite(_run(logits, _random_feed(images))).all()


def test_larger_inputs_are_pooled_to_2d_logits():
  network_fn = nets.get_network_fn("alexnet_v2", NUM_CLASSES)
  with tf.Graph().as_default():
    logits, _ = network_fn(_images(256))
    assert logits.shape.as_list() == [BATCH, NUM_CLASSES]


# --- Batch-norm shim --------------------------------------------------------

@pytest.mark.usefixtures("stock_slim_batch_norm")
def test_stock_slim_batch_norm_fails_without_shim():
  with tf.Graph().as_default():
    try:
      slim.batch_norm(_images(4), is_training=True)
    except ModuleNotFoundError as error:
      assert "tf_keras" in str(error)
    else:
      pytest.skip("stock slim.batch_norm works here; shim not needed")


def test_patch_is_applied_on_import_and_idempotent():
  assert slim_compat.is_slim_batch_norm_patched()
  assert slim_compat.patch_slim_batch_norm() is False
  assert slim_compat.is_slim_batch_norm_patched()


def test_shim_uses_keras_v1_batch_normalization():
  layer_class = slim_layers.normalization_layers.BatchNormalization
  assert issubclass(layer_class, tf1.layers.BatchNormalization)
  assert layer_class.__name__ == "BatchNormalization"


def test_shim_add_weight_compares_by_identity_then_restores_equality(
    monkeypatch):
  seen = []
  base = tf1.layers.BatchNormalization
  real_add_weight = base.add_weight

  def spy(self, *args, **kwargs):
    seen.append(tensor_lib.Tensor._USE_EQUALITY)
    return real_add_weight(self, *args, **kwargs)

  monkeypatch.setattr(base, "add_weight", spy)
  assert tensor_lib.Tensor._USE_EQUALITY
  with tf.Graph().as_default():
    slim.batch_norm(_images(4), is_training=True, scale=True)
  # beta, gamma, moving_mean, moving_variance, each built with `==` = `is`.
  assert seen == [False] * 4
  assert tensor_lib.Tensor._USE_EQUALITY


def test_slim_conv_and_dense_weights_built_with_identity_equality(
    monkeypatch):
  seen = []
  for layer_class in (slim_layers.convolutional_layers.module.Convolution2D,
                      slim_layers.core_layers.module.Dense):
    real = layer_class.add_weight

    def spy(self, *args, real=real, **kwargs):
      seen.append(tensor_lib.Tensor._USE_EQUALITY)
      return real(self, *args, **kwargs)

    monkeypatch.setattr(layer_class, "add_weight", spy)
  with tf.Graph().as_default():
    net = slim.conv2d(_images(2), 3, [3, 3], scope="conv")
    slim.fully_connected(slim.flatten(net), 2, scope="fc")
    names = sorted(v.op.name for v in tf1.global_variables())
  assert names == ["conv/biases", "conv/weights", "fc/biases", "fc/weights"]
  assert seen == [False] * 4  # kernel and bias of each layer.
  assert tensor_lib.Tensor._USE_EQUALITY
  assert slim_compat.patch_slim_layer_weights() is False  # idempotent.


def test_fixes_are_applied_once_per_process(monkeypatch):
  """Wrapping many model_fns scans tf-slim's modules once, not per wrap."""
  import estimator_multigpu as emg  # pylint: disable=g-import-not-at-top
  calls = []
  monkeypatch.setattr(slim_compat, "patch_moved_names",
                      lambda: calls.append("scan") or 0)
  slim_compat.apply_all.cache_clear()
  try:
    for _ in range(3):
      emg.multi_gpu(lambda features, labels, mode: None)
    slim_compat.apply_all()
  finally:
    slim_compat.apply_all.cache_clear()
    monkeypatch.undo()
    slim_compat.apply_all()  # the real fixes, for the tests after this one.
  assert calls == ["scan"]


def test_identity_equality_leaves_eager_mode_alone():
  with slim_compat._identity_equality():
    assert tensor_lib.Tensor._USE_EQUALITY  # eager here: nothing to change.


def test_shim_falls_back_when_tf1_layers_cannot_import(monkeypatch):
  # What TF_USE_LEGACY_KERAS=1 without tf-keras installed does: the lazy
  # tf.compat.v1.layers module raises on first attribute access.
  class _UnloadableLayers:

    def __getattr__(self, name):
      raise ImportError("Keras cannot be imported. Check that it is installed.")

  slim_compat._legacy_layer.cache_clear()
  slim_compat._with_identity_equality.cache_clear()
  monkeypatch.setattr(slim_compat, "tf1",
                      types.SimpleNamespace(layers=_UnloadableLayers()))
  try:
    layer_class = slim_layers.normalization_layers.BatchNormalization
  finally:
    slim_compat._legacy_layer.cache_clear()
    slim_compat._with_identity_equality.cache_clear()
  base = layer_class.__mro__[1]
  assert base.__name__ == "BatchNormalization"
  assert base.__module__.startswith(compat.keras_package() + ".")


@pytest.mark.parametrize("is_training, num_updates", [(True, 2), (False, 0)])
def test_slim_batch_norm_layer(is_training, num_updates):
  with tf.Graph().as_default():
    slim.batch_norm(_images(4), is_training=is_training, scale=True)
    names = sorted(v.op.name for v in tf1.global_variables())
    assert names == ["BatchNorm/beta", "BatchNorm/gamma",
                     "BatchNorm/moving_mean", "BatchNorm/moving_variance"]
    assert len(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)) == num_updates


def test_resnet_trains_batch_norm_moving_statistics():
  network_fn = nets.get_network_fn("resnet_v1_50", NUM_CLASSES,
                                   is_training=True)
  with tf.Graph().as_default():
    images = _images(64)
    logits, _ = network_fn(images)
    variables = {v.op.name: v for v in tf1.global_variables()}
    moving_mean = variables["resnet_v1_50/conv1/BatchNorm/moving_mean"]
    assert "resnet_v1_50/conv1/BatchNorm/moving_variance" in variables
    assert moving_mean in tf1.get_collection(tf1.GraphKeys.MODEL_VARIABLES)
    assert moving_mean not in tf1.trainable_variables()
    update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
    assert len(update_ops) == 2 * 53  # Mean and variance per BatchNorm.
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      before = sess.run(moving_mean)
      out, _ = sess.run([logits, update_ops], _random_feed(images))
      after = sess.run(moving_mean)
  assert np.isfinite(out).all()
  assert not np.allclose(before, after)


# --- CPU-sized nets ---------------------------------------------------------

@pytest.mark.parametrize("name, size, channels", [
    ("lenet", 8, 1), ("mlp", 8, 1), ("cifarnet", 32, 3), ("cifarnet", 8, 1)])
def test_cpu_nets(name, size, channels):
  network_fn = nets.get_network_fn(name, NUM_CLASSES)
  with tf.Graph().as_default():
    images = _images(size, channels)
    logits, end_points = network_fn(images)
    assert logits.shape.as_list() == [BATCH, NUM_CLASSES]
    assert end_points["Predictions"].shape.as_list() == [BATCH, NUM_CLASSES]
    assert np.isfinite(_run(logits, _random_feed(images))).all()


@pytest.mark.parametrize("name", ["lenet", "mlp", "cifarnet"])
def test_dropout_only_when_training(name):
  def two_runs(is_training):
    network_fn = nets.get_network_fn(name, NUM_CLASSES,
                                     is_training=is_training)
    with tf.Graph().as_default():
      tf1.set_random_seed(0)
      images = _images(8, 1)
      logits, _ = network_fn(images)
      with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        feed = _random_feed(images)
        return sess.run(logits, feed), sess.run(logits, feed)

  assert np.array_equal(*two_runs(is_training=False))
  assert not np.array_equal(*two_runs(is_training=True))


@pytest.mark.parametrize("name, num_weights", [
    ("lenet", 4), ("mlp", 3), ("cifarnet", 5), ("alexnet_v2", 8)])
def test_weight_decay_adds_regularization_losses(name, num_weights):
  for weight_decay, expected in [(0.0, 0), (1e-3, num_weights)]:
    network_fn = nets.get_network_fn(name, NUM_CLASSES, weight_decay)
    size = network_fn.default_image_size if name == "alexnet_v2" else 8
    with tf.Graph().as_default():
      network_fn(_images(size, 3))
      losses = tf1.get_collection(tf1.GraphKeys.REGULARIZATION_LOSSES)
      assert len(losses) == expected


def test_mlp_hidden_units():
  network_fn = nets.get_network_fn("mlp", NUM_CLASSES)
  with tf.Graph().as_default():
    logits, _ = network_fn(_images(8, 1), hidden_units=(32, 16, 8))
    shapes = {v.op.name: v.shape.as_list()
              for v in tf1.trainable_variables()}
  assert logits.shape.as_list() == [BATCH, NUM_CLASSES]
  assert shapes["MLP/fc1/weights"] == [64, 32]
  assert shapes["MLP/fc3/weights"] == [16, 8]
  assert shapes["MLP/logits/weights"] == [8, NUM_CLASSES]


def test_cpu_nets_follow_slim_template():
  for module, net_fn in [(lenet, lenet.lenet), (cifarnet, cifarnet.cifarnet),
                         (mlp, mlp.mlp)]:
    arg_scope = getattr(module, net_fn.__name__ + "_arg_scope")
    with tf.Graph().as_default(), slim.arg_scope(arg_scope(1e-4)):
      logits, _ = net_fn(_images(net_fn.default_image_size, 1), 3)
    assert logits.shape.as_list() == [BATCH, 3]
