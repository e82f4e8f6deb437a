"""An image size a net cannot take is refused, for every net (issue 54).

`strides.collapsed_stride` on small hand-built graphs (the sizes worked out by
hand), then train.py's check (cli/data/checks.py) on one net of each family
of nets/ at 8x8: those that end in fixed-size VALID layers fail to build,
those of SAME padding (ResNet, Inception V2) shrink their maps to nothing;
lenet, cifarnet and mlp take 8x8 (the digits).
"""

import pytest
import tensorflow as tf

from cli.data import checks
from nets import strides

tf1 = tf.compat.v1


def conv(x, stride, kernel=3):
  filters = tf.zeros([kernel, kernel, x.shape[-1], 2])
  return tf.nn.conv2d(x, filters, stride, "SAME")


def three_stride_two_convs_then_a_3x3(size):
  """Strides 2, 2, 2 (total 8), then a 3x3 conv, then a global pool."""
  with tf.Graph().as_default() as graph:
    images = tf1.placeholder(tf.float32, [1, size, size, 1])
    h = conv(conv(conv(images, 2), 2), 2)
    h = tf.nn.avg_pool2d(conv(h, 1), h.shape[1], 2, "VALID")  # global.
  return strides.collapsed_stride(graph, images)


def test_a_map_smaller_than_a_stride_collapses():
  # 4 -> 2 -> 1; the third conv strides by 2 over a 1x1 map, and a 3x3
  # conv follows: it takes 8x8 and larger.
  found = three_stride_two_convs_then_a_3x3(4)
  assert (found.stride, found.input_size, found.total) == (2, 1, 8)
  assert found.op_name == "Conv2D_2"
  # 8 -> 4 -> 2 -> 1: the last strided conv gets a 2x2 map; the final
  # pooling (stride 2 over a 1x1 map, nothing spatial after it) is none.
  assert three_stride_two_convs_then_a_3x3(8) is None


@pytest.mark.parametrize("name", [
    "alexnet_v2", "vgg_a", "overfeat", "inception_v1", "inception_v2",
    "inception_v3", "resnet_v1_50", "resnet_v2_50"])
def test_every_family_refuses_8x8_images(name):
  with pytest.raises(ValueError, match=(
      rf"--model_name={name} does not fit 8x8 images of synthetic \(.*\).*"
      r"give --image_size=\d+")):
    checks.check_image_size(name, 8, "synthetic")


@pytest.mark.parametrize("name", ["lenet", "cifarnet", "mlp"])
def test_the_small_nets_take_8x8_images(name):
  checks.check_image_size(name, 8, "digits")


def test_resnet_takes_32_and_names_it_below():
  checks.check_image_size("resnet_v1_50", 32, "synthetic")
  with pytest.raises(ValueError, match=(
      r"\(it downsamples them by 32: `resnet_v1_50/block3/\S+` strides by 2 "
      r"over a 1x1 map\); it takes 32x32 and larger \(default size 224\): "
      r"give --image_size=32 or more")):
    checks.check_image_size("resnet_v1_50", 16, "synthetic")
