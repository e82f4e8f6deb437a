"""What an exported classifier takes: pixels, or encoded JPEG/PNG bytes.

export.py writes one SavedModel with three signatures; each returns
`classes` (int32 [N]) and `probabilities` (float32 [N, num_classes]):

- `serving_default` takes `images`: a uint8 batch [N, H, W, C] of pixels
  0..255 (black..white), as image libraries (Pillow, OpenCV, imageio,
  `tf.io.decode_image`) return them, any N, H and W. The graph brings them
  to the dataset's raw range (x 16 / 255 for digits, as they are for
  TFRecord images), resizes them (bilinear) to the image size and scales
  them as training did.
- `float:serving_default` takes `images` as a float32 batch in the
  dataset's own raw range (0..16 for digits, 0..255 for images from
  TFRecords, 0..1 for synthetic): the net's input before its scaling.
- `encoded:serving_default` takes `image_bytes`: a string vector [N] of
  encoded images (JPEG, PNG, GIF or BMP, 8- or 16-bit, any mix and any
  sizes). Each is decoded to the dataset's channel count, read as the full
  range of its format (0 black, 255 or 65535 white), resized, brought to the
  dataset's raw range (x 16 for digits, x 255 for TFRecord images) and then
  preprocessed exactly as `images`. The names are Estimator's for receiver
  alternatives: `<receiver>:<export output>`.

So one picture gives the net the same input through every signature: its
uint8 pixels, its PNG file, and its pixels x white / 255 as floats (white:
16 for digits, 255 for TFRecord images). A PNG of a digits image (raw k in
0..16) stores round(k * 255 / 16), and the rounding moves the net's input
by at most 0.5 / 255 from k / 16. JPEG is lossy: the answer is the one of
the decoded pixels (measured on 8x8 digits at quality 95: probabilities
within 0.03, 4 of 360 classes changed, for a 30-step mlp).
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

tf1 = tf.compat.v1
Receiver = tf.estimator.export.TensorServingInputReceiver

RAW_INPUT = "images"  # uint8 in serving_default, float32 in `float:`.
ENCODED_INPUT = "image_bytes"
ENCODED_RECEIVER = "encoded"
FLOAT_RECEIVER = "float"
RAW_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
ENCODED_SIGNATURE = f"{ENCODED_RECEIVER}:{RAW_SIGNATURE}"
FLOAT_SIGNATURE = f"{FLOAT_RECEIVER}:{RAW_SIGNATURE}"


def raw_net_input(images: tf.Tensor, image_size: int,
                  pixel_scale: float) -> tf.Tensor:
  """Raw pixels [N, H, W, C] to the net's input [N, S, S, C]: resize, scale."""
  resized = tf.image.resize(images, [image_size, image_size],
                            method=tf.image.ResizeMethod.BILINEAR)
  return resized * pixel_scale


def decode_images(image_bytes: tf.Tensor, image_size: int,
                  channels: int) -> tf.Tensor:
  """Encoded images [N] to float32 [N, S, S, C] in [0, 1] (format's range).

  Each image is decoded and resized on its own, so sizes may differ.
  """
  def decode(one: tf.Tensor) -> tf.Tensor:
    image = tf.io.decode_image(one, channels=channels, dtype=tf.float32,
                               expand_animations=False)
    return tf.image.resize(image, [image_size, image_size],
                           method=tf.image.ResizeMethod.BILINEAR)

  spec = tf.TensorSpec([image_size, image_size, channels], tf.float32)
  return tf.map_fn(decode, image_bytes, fn_output_signature=spec)


def encoded_net_input(image_bytes: tf.Tensor, image_size: int, channels: int,
                      pixel_scale: float) -> tf.Tensor:
  """Encoded images [N] to the net's input: decoded, in the raw range, raw path.

  The decoded [0, 1] picture is multiplied by the dataset's white level
  (1 / pixel_scale: 16 for digits, 255 for TFRecord images), so it then goes
  through `raw_net_input` like raw pixels of the same picture.
  """
  decoded = decode_images(image_bytes, image_size, channels)
  return raw_net_input(decoded * (1.0 / pixel_scale), image_size, pixel_scale)


def check_preprocessing(preprocessing: dict) -> tuple:
  """`(channels, pixel_scale)` of a dataset's preprocessing dict.

  Raises:
    ValueError: a field is missing or not positive.
  """
  channels = preprocessing.get("channels")
  scale = preprocessing.get("pixel_scale", 1.0)
  if not isinstance(channels, int) or channels < 1 or not scale > 0:
    raise ValueError(
        f"The preprocessing is {preprocessing!r}; expected a positive int "
        "`channels` and a positive `pixel_scale`, as datasets.preprocessing("
        "name) returns. Re-run train.py to rewrite run_config.json.")
  return channels, float(scale)


def pixels_net_input(pixels: tf.Tensor, image_size: int,
                     pixel_scale: float) -> tf.Tensor:
  """uint8 pixels [N, H, W, C] (0..255) to the net's input: brought to the
  dataset's raw range (white = 1 / pixel_scale), then `raw_net_input`."""
  white = 1.0 / pixel_scale
  raw = tf.cast(pixels, tf.float32) * (white / 255.0)
  return raw_net_input(raw, image_size, pixel_scale)


def _empty_batch(name: str, image_size: int, channels: int,
                 dtype: tf.DType) -> tf.Tensor:
  """An input of `dtype` images that defaults to an empty batch."""
  return tf1.placeholder_with_default(
      tf.zeros([0, image_size, image_size, channels], dtype),
      [None, None, None, channels], name=name)


def receiver_fn(image_size: int, preprocessing: dict
                ) -> Callable[[], Receiver]:
  """The serving input function of export: uint8 `images`, float32
  `images` (the `float` alternative) or `image_bytes`.

  Each input is a `placeholder_with_default` of an empty batch, and the
  net's input is the three preprocessed batches one after the other: each
  signature feeds one of them and the others add nothing.
  """
  channels, scale = check_preprocessing(preprocessing)

  def input_fn() -> Receiver:
    pixels = _empty_batch(RAW_INPUT, image_size, channels, tf.uint8)
    floats = _empty_batch("float_images", image_size, channels, tf.float32)
    image_bytes = tf1.placeholder_with_default(
        tf.zeros([0], tf.string), [None], name=ENCODED_INPUT)
    features = tf.concat(
        [pixels_net_input(pixels, image_size, scale),
         raw_net_input(floats, image_size, scale),
         encoded_net_input(image_bytes, image_size, channels, scale)], 0)
    return Receiver(
        features, {RAW_INPUT: pixels},
        {FLOAT_RECEIVER: {RAW_INPUT: floats},
         ENCODED_RECEIVER: {ENCODED_INPUT: image_bytes}})

  return input_fn
