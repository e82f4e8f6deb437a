"""Wrap a single-device Estimator model_fn with `multi_gpu`: a 2-minute tour.

Trains a small MLP on scikit-learn's bundled 8x8 digits with two towers
(two GPUs if the machine has them, else two virtual CPU devices), then
evaluates it on held-out digits. Run: python examples/quickstart.py
Its checkpoints go to a temporary folder, removed at the end.

It uses only the library (no `nets/`, no `datasets/`): the input_fn below is
an ordinary tf.data pipeline. Its logs are quiet as train.py's (this
checkout's cli/script_logging.py: no TensorFlow INFO lines or deprecation
notices; --verbosity=1 brings them back).
"""

import math
import os
import sys
import tempfile

from absl import app
from absl import flags
from absl import logging
import numpy as np
from sklearn import datasets as sk_datasets

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cli import script_logging  # pylint: disable=g-import-not-at-top,wrong-import-position

script_logging.before_tensorflow()  # C++ log level: before TensorFlow.

# pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf

import estimator_multigpu as emg

tf1 = tf.compat.v1
_HELD_OUT = 297  # the last 297 of the 1,797 digits are for evaluation.


def input_fn(split: str, batch_size: int):
  """Returns an input_fn over scikit-learn's bundled 8x8 digits."""
  def make_dataset():
    digits = sk_datasets.load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    labels = digits.target.astype(np.int32)
    part = slice(None, -_HELD_OUT) if split == "train" else slice(-_HELD_OUT,
                                                                 None)
    dataset = tf.data.Dataset.from_tensor_slices((images[part], labels[part]))
    if split == "train":
      dataset = dataset.shuffle(2048, seed=0).repeat()
    return dataset.batch(batch_size)
  return make_dataset


def model_fn(features, labels, mode, params):
  """An ordinary single-device model_fn; only the optimizer is wrapped."""
  hidden = tf1.layers.dense(tf1.layers.flatten(features), 64, tf.nn.relu)
  logits = tf1.layers.dense(hidden, 10)
  predictions = {"class": tf.argmax(logits, axis=1)}
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions=predictions)
  loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
  optimizer = emg.TowerOptimizer(  # <- the one change inside the model_fn.
      tf1.train.AdamOptimizer(params["learning_rate"]))
  train_op = optimizer.minimize(loss, tf1.train.get_global_step())
  accuracy = tf1.metrics.accuracy(labels, predictions["class"])
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                    eval_metric_ops={"accuracy": accuracy})


def main(argv):
  del argv
  script_logging.configure(flags.FLAGS.verbosity)
  gpus = emg.devices.num_visible_gpus()
  devices = 2 if gpus >= 2 else ["/cpu:0", "/cpu:1"]
  with tempfile.TemporaryDirectory(prefix="quickstart-") as model_dir:
    estimator = tf.estimator.Estimator(
        emg.multi_gpu(model_fn, devices=devices),  # <- wrap the model_fn.
        params={"learning_rate": 0.01},
        config=tf.estimator.RunConfig(
            model_dir=model_dir,
            session_config=emg.make_session_config(num_cpus=2)))
    estimator.train(input_fn("train", 64), max_steps=400)
    # Every held-out batch, counted: the input is not read past its end.
    metrics = estimator.evaluate(input_fn("eval", 64),
                                 steps=math.ceil(_HELD_OUT / 64))
  logging.info("held-out accuracy %.3f after %d steps", metrics["accuracy"],
               metrics["global_step"])
  print(f"accuracy={metrics['accuracy']:.4f} "
        f"global_step={metrics['global_step']}")


if __name__ == "__main__":
  app.run(main)
