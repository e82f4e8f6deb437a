"""`--preprocessing_name`'s augmentation, `labels_offset` and epoch sizes.

The random crops and flips are checked against every crop and flip numpy
cuts out of the zero-padded image: each output must be exactly one of them,
and over many seeds every offset and both sides must come up.
"""

import itertools
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import datasets
from datasets import digits
from preprocessing import crop_flip
from preprocessing import preprocessing_factory

tf1 = tf.compat.v1
HEIGHT, WIDTH = 6, 5  # padding 1 on each side: 6 // 8 and 5 // 8 are < 1.


def numpy_candidates(image, pad=1):
  """{(dy, dx, flipped): array} of every window of the padded image."""
  height, width = image.shape[:2]
  padded = np.pad(image, [(pad, pad), (pad, pad), (0, 0)])
  windows = {}
  for dy, dx in itertools.product(range(2 * pad + 1), repeat=2):
    window = padded[dy:dy + height, dx:dx + width]
    windows[(dy, dx, False)] = window
    windows[(dy, dx, True)] = window[:, ::-1]
  return windows


def match(output, candidates):
  found = [key for key, window in candidates.items()
           if np.array_equal(output, window)]
  assert len(found) == 1, f"output is not exactly one crop: {found}"
  return found[0]


def run_preprocessing(name, image, seeds):
  fn = preprocessing_factory.get_preprocessing(name, is_training=True)
  with tf.Graph().as_default(), tf1.Session() as session:
    seed = tf1.placeholder(tf.int64, [2])
    output = fn(tf.constant(image), HEIGHT, WIDTH, seed=seed)
    return [session.run(output, {seed: [s, 7]}) for s in seeds]


def test_crop_flip_is_one_of_numpy_crops_and_covers_them_all():
  image = np.random.RandomState(0).rand(HEIGHT, WIDTH, 3).astype(np.float32)
  candidates = numpy_candidates(image)
  outputs = run_preprocessing("crop_flip", image, range(100))
  chosen = [match(output, candidates) for output in outputs]
  # 100 draws over 9 offsets: all 9 show, and both sides.
  assert {key[:2] for key in chosen} == set(itertools.product(range(3),
                                                              repeat=2))
  assert {key[2] for key in chosen} == {False, True}
  again = run_preprocessing("crop_flip", image, range(100))
  assert all(np.array_equal(a, b) for a, b in zip(outputs, again))


def test_crop_never_flips():
  image = np.random.RandomState(1).rand(HEIGHT, WIDTH, 1).astype(np.float32)
  candidates = numpy_candidates(image)
  chosen = [match(output, candidates)
            for output in run_preprocessing("crop", image, range(30))]
  assert not any(flipped for _, _, flipped in chosen)
  assert len({key[:2] for key in chosen}) > 1


def test_padding_is_an_eighth_of_the_side():
  # tf-slim's cifarnet pads its 32-pixel images by 4.
  assert [crop_flip.padding(s) for s in (5, 8, 32, 224)] == [1, 1, 4, 28]


@pytest.mark.parametrize("name", preprocessing_factory.PREPROCESSING_NAMES)
def test_evaluation_only_resizes(name):
  image = np.random.RandomState(2).rand(4, 4, 3).astype(np.float32)
  fn = preprocessing_factory.get_preprocessing(name, is_training=False)
  assert not preprocessing_factory.is_random(name, is_training=False)
  with tf.Graph().as_default(), tf1.Session() as session:
    got = session.run(fn(tf.constant(image), 8, 8))
    same = session.run(fn(tf.constant(image), 4, 4))
  # Bilinear upsampling x2 (half-pixel centres): output pixel 1 sits at
  # input coordinate 0.25, so it is 0.75 * pixel 0 + 0.25 * pixel 1.
  np.testing.assert_allclose(got[1, 1], (
      0.75 * 0.75 * image[0, 0] + 0.75 * 0.25 * image[0, 1] +
      0.25 * 0.75 * image[1, 0] + 0.25 * 0.25 * image[1, 1]), rtol=1e-5)
  np.testing.assert_array_equal(same, image)


def collect(dataset, batches=1):
  with tf.Graph().as_default():
    next_batch = tf1.data.make_one_shot_iterator(dataset()).get_next()
    with tf1.Session() as session:
      return [session.run(next_batch) for _ in range(batches)]


def test_digits_training_crops_the_scaled_images_in_the_pipeline():
  images, labels = digits.load_split("train")
  (got, got_labels), = collect(lambda: datasets.get_dataset(
      "digits", "train", 4, shuffle=False, preprocessing_name="crop", seed=5))
  np.testing.assert_array_equal(got_labels, labels[:4])
  for output, image in zip(got, images[:4]):
    candidates = numpy_candidates(image.astype(np.float32) / 16.0)
    assert not match(output, candidates)[2]


def test_digits_eval_ignores_the_training_augmentation():
  images, _ = digits.load_split("eval")
  (got, _), = collect(lambda: datasets.get_dataset(
      "digits", "eval", 5, preprocessing_name="crop"))
  np.testing.assert_array_equal(got, images[:5] / np.float32(16.0))


@pytest.mark.parametrize("name,dataset,message", [
    ("crop_flip", "digits", "mirror.*use 'crop'"),
    ("crop", "synthetic", "random pixels; use 'resize'"),
    ("inception", "tfrecord", "expected one of resize, crop, crop_flip")])
def test_unsuitable_preprocessing_is_refused(name, dataset, message):
  with pytest.raises(ValueError, match=message):
    datasets.get_dataset(dataset, "train", 4, image_size=4, data_dir="/tmp",
                         preprocessing_name=name)


def write_records(data_dir, labels, class_names):
  """One 'train' shard of 2x2 grey PNGs with the given stored labels."""
  path = os.path.join(data_dir, "train-00000-of-00001.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    for label in labels:
      pixels = np.full([2, 2, 3], 40 * label, np.uint8)
      png = tf.io.encode_png(pixels).numpy()
      writer.write(datasets.make_example(png, b"png", label, 2, 2)
                   .SerializeToString())
  datasets.write_label_file(class_names, data_dir)


def test_labels_offset_drops_the_background_class(tmp_path):
  data_dir = str(tmp_path)
  write_records(data_dir, [3, 1, 2], ["background", "a", "b", "c"])
  (images, labels), = collect(lambda: datasets.get_dataset(
      "tfrecord", "train", 3, image_size=2, data_dir=data_dir,
      labels_offset=1, shuffle=False, repeat=False))
  np.testing.assert_array_equal(labels, [2, 0, 1])  # stored 3, 1, 2 minus 1.
  np.testing.assert_allclose(images[:, 0, 0, 0], np.array([120, 40, 80]) / 255.0,
                             rtol=1e-6)
  assert datasets.num_examples("tfrecord", "train", data_dir) == 3


def test_labels_offset_on_a_background_example_fails(tmp_path):
  data_dir = str(tmp_path)
  write_records(data_dir, [0, 1], ["background", "a"])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="label 0 minus --labels_offset=1 of record 0 in "):
    collect(lambda: datasets.get_dataset(
        "tfrecord", "train", 2, image_size=2, data_dir=data_dir,
        labels_offset=1, repeat=False))
  with pytest.raises(ValueError, match="labels_offset=1 .*'digits' has "
                     "labels from 0"):
    datasets.get_dataset("digits", "train", 2, labels_offset=1)


def test_epoch_sizes():
  assert datasets.num_examples("digits", "train") == 1437  # 80 % of 1,797.
  assert datasets.num_examples("digits", "eval") == 360
  with pytest.raises(ValueError, match="without epochs.*--decay_steps"):
    datasets.num_examples("synthetic", "train")


def test_training_input_from_another_split_repeats_in_whole_batches():
  # 360 eval digits in batches of 7: as training input, batch 52 comes from
  # the second epoch (51 * 7 = 357), and every batch is whole.
  batches = collect(lambda: datasets.get_dataset(
      "digits", "eval", 7, is_training=True, seed=1), batches=53)
  assert all(images.shape[0] == 7 for images, _ in batches)


def test_a_truncated_shard_cannot_be_counted(tmp_path):
  data_dir = str(tmp_path)
  write_records(data_dir, [1, 2], ["a", "b", "c"])
  path = os.path.join(data_dir, "train-00000-of-00001.tfrecord")
  with open(path, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(data[:-5])  # the last record loses its end.
  with pytest.raises(ValueError, match=(
      f"Cannot count the records of {re.escape(path)} \\(.*truncated "
      "record.*\\); "
      "rewrite the damaged shard")) as caught:
    datasets.num_examples("tfrecord", "train", data_dir)
  assert "\n" not in str(caught.value)  # no graph traceback in it.
