"""Setups of tests/scripts/test_mistakes.py: bad data and model dirs.

Each function takes the row's folder and writes into it (records under
`<folder>/data`, a model dir under `<folder>/model`).
"""

import json
import os
import socket

import numpy as np
import tensorflow as tf

from datasets import tfrecord

SHARD = "train-00000-of-00001.tfrecord"


def png() -> bytes:
  return tf.io.encode_png(np.zeros((8, 8, 3), np.uint8)).numpy()


def write_records(folder: str, images_and_labels, classes: int = 3) -> str:
  """A split of one shard plus labels.txt; returns the shard's path."""
  os.makedirs(folder, exist_ok=True)
  tfrecord.write_label_file([f"c{i}" for i in range(classes)], folder)
  path = os.path.join(folder, SHARD)
  with tf.io.TFRecordWriter(path) as writer:
    for image, label in images_and_labels:
      writer.write(tfrecord.make_example(image, b"png", label, 8, 8)
                   .SerializeToString())
  return path


def good_records(tmp: str) -> str:
  return write_records(f"{tmp}/data", [(png(), k % 3) for k in range(3)])


def zero_byte_shard(tmp):
  open(good_records(tmp), "wb").close()


def truncated_shard(tmp):
  path = good_records(tmp)
  os.truncate(path, os.path.getsize(path) - 10)  # into record 2 of 3.


def corrupt_shard(tmp):
  path = good_records(tmp)
  data = bytearray(open(path, "rb").read())
  data[20:30] = b"x" * 10  # record 0's data: its CRC no longer matches.
  open(path, "wb").write(bytes(data))


def undecodable_image(tmp):
  write_records(f"{tmp}/data", [(png(), 0), (b"not an image", 1)])


def damaged_image(tmp):
  """A PNG cut short: its first bytes pass the quick check, decoding fails."""
  write_records(f"{tmp}/data", [(png(), 0), (png()[:40], 1)])


def label_out_of_range(tmp):
  write_records(f"{tmp}/data", [(png(), 1), (png(), 7)])  # 3 classes.


def negative_label(tmp):
  write_records(f"{tmp}/data", [(png(), -1), (png(), 0)])


def one_class(tmp):
  write_records(f"{tmp}/data", [(png(), 0), (png(), 0)], classes=1)


def no_shards(tmp):
  os.makedirs(f"{tmp}/data")


def garbled_labels_file(tmp):
  good_records(tmp)
  with open(f"{tmp}/data/labels.txt", "w") as f:
    f.write("zero\n")


def garbled_run_config(tmp):
  os.makedirs(f"{tmp}/model")
  with open(f"{tmp}/model/run_config.json", "w") as f:
    f.write("{")


def empty_model_dir(tmp):
  os.makedirs(f"{tmp}/model")


def live_lock(tmp):
  """A model dir whose lock names a live process (this one's parent)."""
  os.makedirs(f"{tmp}/model")
  with open(f"{tmp}/model/train.lock", "w") as f:
    json.dump({"host": socket.gethostname(), "pid": os.getppid(),
               "job": None, "started": "earlier"}, f)
