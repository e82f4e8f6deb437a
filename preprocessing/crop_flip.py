"""Random crop and left-right flip: tf-slim's standard training augmentation.

Training (`preprocess_for_train`) first does what evaluation does, a
bilinear resize to the output size, then pads every side with
`padding(size)` zero pixels (an eighth of the side: 4 for 32 pixels, as
tf-slim's cifarnet_preprocessing), cuts a random window of the output size
out of that and, with `flip`, mirrors it left-right with probability 1/2.
The scale of the objects is thus the same in training and evaluation; only
their position (and side) moves. The random choices come from stateless ops
and a per-image `seed`, so a seed always gives the same crop and flip.

Evaluation (`preprocess_for_eval`) is the plain resize.
"""

from typing import Optional

import tensorflow as tf


def padding(size: int) -> int:
  """Zero pixels added on each side of a `size`-pixel side: size // 8, >= 1."""
  return max(1, size // 8)


def preprocess_for_eval(image: tf.Tensor, output_height: int,
                        output_width: int,
                        seed: Optional[tf.Tensor] = None) -> tf.Tensor:
  """Bilinearly resizes `image` to the output size (no-op if already so).

  Args:
    image: float [H, W, C] image.
    output_height, output_width: the size wanted.
    seed: unused (evaluation is deterministic).

  Returns:
    float [output_height, output_width, C].
  """
  del seed
  static = image.shape[-3:-1]
  hw = (output_height, output_width)
  if static.is_fully_defined() and tuple(static.as_list()) == hw:
    return image
  return tf.image.resize(image, hw, method=tf.image.ResizeMethod.BILINEAR)


def preprocess_for_train(image: tf.Tensor, output_height: int,
                         output_width: int, seed: tf.Tensor,
                         flip: bool = True) -> tf.Tensor:
  """Resize, zero-pad, random crop and (with `flip`) random mirror.

  Args:
    image: float [H, W, C] image.
    output_height, output_width: the size wanted.
    seed: int [2] stateless seed of this image's random choices.
    flip: also mirror left-right with probability 1/2.

  Returns:
    float [output_height, output_width, C].
  """
  image = preprocess_for_eval(image, output_height, output_width)
  pad_h, pad_w = padding(output_height), padding(output_width)
  padded = tf.pad(image, [[pad_h, pad_h], [pad_w, pad_w], [0, 0]])
  crop_seed, flip_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, num=2))
  size = tf.stack([output_height, output_width, tf.shape(image)[-1]])
  image = tf.image.stateless_random_crop(padded, size, seed=crop_seed)
  if flip:
    image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
  return image
