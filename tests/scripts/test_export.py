"""export.py's three signatures: uint8 pixels (serving_default), raw float
pixels and encoded JPEG/PNG bytes."""

import os
import sys

import numpy as np
import pytest
from script_runs import run_command
import tensorflow as tf

import datasets
import serving

tf1 = tf.compat.v1
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
DIGITS = {"channels": 1, "pixel_scale": 1.0 / 16}  # datasets.preprocessing.
RECORDS = {"channels": 3, "pixel_scale": 1.0 / 255}


def digits_pictures(count):
  """`count` held-out digits: raw 0..16 floats and their 8-bit PNG pixels."""
  images, _ = datasets.load_digits_split("eval")
  raw = images[:count].astype(np.float32)
  return raw, np.round(raw * 255 / 16).astype(np.uint8)


def encode(images, encoder=tf.io.encode_png):
  return [encoder(tf.constant(image)).numpy() for image in images]


def net_inputs(image_size, preprocessing, raw=None, image_bytes=None,
               pixels=None):
  """The net's input from the serving graph, fed through one signature:
  `pixels` (uint8, serving_default), `raw` (float) or `image_bytes`."""
  with tf.Graph().as_default(), tf1.Session() as session:
    receiver = serving.receiver_fn(image_size, preprocessing)()
    if pixels is not None:
      feed = {receiver.receiver_tensors[serving.RAW_INPUT]: pixels}
    elif raw is not None:
      alternative = receiver.receiver_tensors_alternatives[
          serving.FLOAT_RECEIVER]
      feed = {alternative[serving.RAW_INPUT]: raw}
    else:
      alternative = receiver.receiver_tensors_alternatives[
          serving.ENCODED_RECEIVER]
      feed = {alternative[serving.ENCODED_INPUT]: image_bytes}
    return session.run(receiver.features, feed)


def test_digits_png_gives_the_raw_signatures_net_input():
  raw, pixels = digits_pictures(7)
  encoded = net_inputs(8, DIGITS, image_bytes=encode(pixels))
  # The PNG's 0..255 is black..white: the net sees pixel / 255 ...
  np.testing.assert_allclose(encoded, pixels / 255.0, atol=1e-6)
  # ... exactly what the raw signature makes of the same picture in the
  # digits' range (x 16 / 255), and within 0.5 / 255 of the raw digits' k/16.
  same_picture = net_inputs(8, DIGITS, raw=pixels * (16 / 255.0))
  np.testing.assert_allclose(encoded, same_picture, atol=1e-6)
  np.testing.assert_allclose(net_inputs(8, DIGITS, raw=raw), raw / 16,
                             atol=1e-7)
  assert np.abs(encoded - raw / 16).max() <= 0.5 / 255 + 1e-7
  # serving_default: the PNG's own uint8 pixels, the PNG's net input.
  np.testing.assert_allclose(net_inputs(8, DIGITS, pixels=pixels), encoded,
                             atol=1e-6)


def test_uint8_pixels_are_black_to_white_for_every_dataset():
  rng = np.random.default_rng(1)
  pixels = rng.integers(0, 256, [3, 6, 4, 3], dtype=np.uint8)
  # TFRecord images: 0..255 raw, scaled by 1 / 255; resized 6x4 -> 4x4
  # bilinear, as the raw floats are.
  np.testing.assert_allclose(
      net_inputs(4, RECORDS, pixels=pixels),
      net_inputs(4, RECORDS, raw=pixels.astype(np.float32)), atol=1e-6)
  square = pixels[:, :4]  # already 4x4: pixel / 255, no resizing.
  np.testing.assert_allclose(net_inputs(4, RECORDS, pixels=square),
                             square / 255.0, atol=1e-6)
  synthetic = {"channels": 3, "pixel_scale": 1.0}  # raw 0..1.
  np.testing.assert_allclose(
      net_inputs(4, synthetic, pixels=pixels),
      net_inputs(4, synthetic, raw=pixels / np.float32(255)), atol=1e-6)


def test_encoded_batch_mixes_sizes_formats_and_bit_depths():
  rng = np.random.default_rng(0)
  small = rng.integers(0, 256, [4, 4, 3], dtype=np.uint8)
  large = rng.integers(0, 256, [8, 8, 3], dtype=np.uint8)
  gray = rng.integers(0, 256, [4, 4, 1], dtype=np.uint8)
  deep = rng.integers(0, 65536, [4, 4, 3], dtype=np.uint16)
  files = encode([small, large, gray, deep])
  got = net_inputs(4, RECORDS, image_bytes=files)
  np.testing.assert_allclose(got[0], small / 255.0, atol=1e-6)
  # Bilinear 8 -> 4 with half-pixel centres samples at 2i + 0.5: the mean of
  # each 2x2 block.
  blocks = large.reshape(4, 2, 4, 2, 3).mean(axis=(1, 3))
  np.testing.assert_allclose(got[1], blocks / 255.0, atol=1e-6)
  np.testing.assert_allclose(got[2], np.repeat(gray, 3, -1) / 255.0,
                             atol=1e-6)  # grayscale decoded to 3 channels.
  np.testing.assert_allclose(got[3], deep / 65535.0, atol=1e-6)  # 16-bit.
  # The raw signature on the same 0..255 pictures gives the same input.
  raw = net_inputs(4, RECORDS, raw=np.stack([small, blocks, np.repeat(
      gray, 3, -1), deep / 257.0]).astype(np.float32))
  np.testing.assert_allclose(got, raw, atol=1e-6)


def test_jpeg_is_served_as_decoded():
  _, pixels = digits_pictures(3)
  files = encode(pixels, lambda image: tf.io.encode_jpeg(image, quality=95))
  decoded = np.stack([tf.io.decode_jpeg(f, channels=1).numpy()
                      for f in files])
  np.testing.assert_allclose(net_inputs(8, DIGITS, image_bytes=files),
                             decoded / 255.0, atol=1e-6)


def test_each_signature_feeds_only_its_own_images():
  raw, pixels = digits_pictures(5)
  assert net_inputs(8, DIGITS, raw=raw).shape == (5, 8, 8, 1)
  assert net_inputs(8, DIGITS, image_bytes=encode(pixels[:2])).shape == (
      2, 8, 8, 1)
  assert net_inputs(8, DIGITS, raw=raw[:0]).shape == (0, 8, 8, 1)
  assert net_inputs(8, DIGITS, pixels=pixels[:3]).shape == (3, 8, 8, 1)


@pytest.mark.parametrize("preprocessing", [
    {"pixel_scale": 0.5}, {"channels": 0, "pixel_scale": 1.0},
    {"channels": 3, "pixel_scale": 0.0}])
def test_bad_preprocessing_says_what_and_how_to_fix(preprocessing):
  with pytest.raises(ValueError, match=r"The preprocessing is .*expected a "
                     r"positive int `channels`.*Re-run train.py"):
    serving.receiver_fn(8, preprocessing)


def run(*command):
  return run_command(*command).stdout


def run_script(script, *args):
  return run(sys.executable, os.path.join(ROOT, script), *args)


def saved_model_cli_run(saved_model, signature, inputs, tmp_path):
  """`saved_model_cli run` on {input name: array}; the outputs it saved."""
  args = []
  for name, array in inputs.items():
    path = tmp_path / f"{name}.npy"
    np.save(path, array, allow_pickle=True)
    args.append(f"{name}={path}")
  outdir = tmp_path / "cli_outputs"
  cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
  run(cli, "run", "--dir", saved_model, "--tag_set", "serve",
      "--signature_def", signature, "--inputs", ";".join(args),
      "--outdir", str(outdir))
  return {name: np.load(outdir / f"{name}.npy")
          for name in ("classes", "probabilities")}


@pytest.mark.slow
def test_export_serves_raw_and_encoded_images_with_evals_answers(tmp_path):
  model_dir = str(tmp_path / "run")
  run_script("train.py", "--model_name=mlp", f"--model_dir={model_dir}",
             "--max_steps=30")
  metrics = run_script("eval.py", f"--model_dir={model_dir}", "--once")
  accuracy = float(metrics.split("accuracy=")[1].split()[0])
  saved_model = run_script("export.py", f"--model_dir={model_dir}",
                           f"--export_dir={tmp_path / 'export'}"
                           ).strip().splitlines()[-1]

  loaded = tf.saved_model.load(saved_model)
  assert set(loaded.signatures) == {serving.RAW_SIGNATURE,
                                    serving.FLOAT_SIGNATURE,
                                    serving.ENCODED_SIGNATURE}
  pixels_fn = loaded.signatures[serving.RAW_SIGNATURE]
  raw_fn = loaded.signatures[serving.FLOAT_SIGNATURE]
  encoded_fn = loaded.signatures[serving.ENCODED_SIGNATURE]
  raw, pixels = digits_pictures(360)  # the whole held-out split.
  _, labels = datasets.load_digits_split("eval")
  served = raw_fn(images=tf.constant(raw))
  assert (served["classes"].numpy() == labels).mean() == pytest.approx(
      accuracy, abs=1e-4)  # eval.py prints 4 decimals.
  # The same PNG pictures through the raw signature, x 16 / 255 (digits).
  expected = raw_fn(images=tf.constant(pixels * np.float32(16 / 255)))
  files = encode(pixels)
  for batch in (1, 7):
    np.testing.assert_allclose(
        raw_fn(images=tf.constant(raw[:batch]))["probabilities"],
        served["probabilities"][:batch], atol=1e-5)
    answer = encoded_fn(image_bytes=tf.constant(files[:batch]))
    np.testing.assert_allclose(answer["probabilities"],
                               expected["probabilities"][:batch], atol=1e-5)
    np.testing.assert_array_equal(answer["classes"],
                                  expected["classes"][:batch])
    as_pixels = pixels_fn(images=tf.constant(pixels[:batch]))  # uint8.
    np.testing.assert_allclose(as_pixels["probabilities"],
                               expected["probabilities"][:batch], atol=1e-5)

  cli = saved_model_cli_run(saved_model, serving.ENCODED_SIGNATURE, {
      serving.ENCODED_INPUT: np.array(files[:7], dtype=object)}, tmp_path)
  np.testing.assert_allclose(cli["probabilities"],
                             expected["probabilities"][:7], atol=1e-5)
  np.testing.assert_array_equal(cli["classes"], expected["classes"][:7])
